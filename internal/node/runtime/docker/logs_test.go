package docker

import (
	"slices"
	"strings"
	"testing"
)

// TestLogLineWriter: records per line, a partial line flushed with a
// newline, a line over maxLogLine split.
func TestLogLineWriter(t *testing.T) {
	var recs []string
	w := &lineWriter{stream: "stdout", emit: func(b []byte) error { recs = append(recs, string(b)); return nil }}
	for _, p := range []string{"a\nb", "c\n\nd"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"stdout a\n", "stdout bc\n", "stdout \n", "stdout d\n"}; !slices.Equal(recs, want) {
		t.Errorf("records %q, want %q", recs, want)
	}
	recs = nil
	long := strings.Repeat("x", 2*maxLogLine+10)
	if _, err := w.Write([]byte(long + "\n")); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || len(recs[0]) != len("stdout \n")+maxLogLine || recs[2] != "stdout "+strings.Repeat("x", 10)+"\n" {
		t.Errorf("long line: %d records", len(recs))
	}
	if len(w.buf) != 0 || cap(w.buf) > 2*maxLogLine {
		t.Errorf("buffer after a long line: len %d cap %d", len(w.buf), cap(w.buf))
	}
}
