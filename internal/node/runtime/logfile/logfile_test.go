package logfile

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

func writeLog(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "serial.log")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func readAll(t *testing.T, p string, o Options) string {
	t.Helper()
	o.Prefix = "serial"
	r, err := Open(context.Background(), p, o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWholeAndTail(t *testing.T) {
	p := writeLog(t, "a\nb\nc\nd")
	if got, want := readAll(t, p, Options{}), "serial a\nserial b\nserial c\nserial d"; got != want {
		t.Errorf("whole = %q, want %q", got, want)
	}
	if got, want := readAll(t, p, Options{LogOptions: runtime.LogOptions{Tail: 2}}), "serial c\nserial d"; got != want {
		t.Errorf("tail 2 = %q, want %q", got, want)
	}
	p2 := writeLog(t, "a\nb\nc\n")
	if got, want := readAll(t, p2, Options{LogOptions: runtime.LogOptions{Tail: 1}}), "serial c\n"; got != want {
		t.Errorf("tail 1 = %q, want %q", got, want)
	}
	if got, want := readAll(t, p2, Options{LogOptions: runtime.LogOptions{Tail: 10}}), "serial a\nserial b\nserial c\n"; got != want {
		t.Errorf("tail 10 = %q, want %q", got, want)
	}
	// A tail across the backwards scan's chunk boundary.
	long := strings.Repeat(strings.Repeat("x", 999)+"\n", 100)
	p3 := writeLog(t, long)
	if got := readAll(t, p3, Options{LogOptions: runtime.LogOptions{Tail: 40}}); strings.Count(got, "serial ") != 40 {
		t.Errorf("tail 40 of 100 long lines gave %d lines", strings.Count(got, "serial "))
	}
}

func TestSinceByModTime(t *testing.T) {
	p := writeLog(t, "old\n")
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, p, Options{LogOptions: runtime.LogOptions{Since: time.Now().Add(-time.Minute)}}); got != "" {
		t.Errorf("since after mtime = %q, want nothing", got)
	}
	if got := readAll(t, p, Options{LogOptions: runtime.LogOptions{Since: old.Add(-time.Minute)}}); got != "serial old\n" {
		t.Errorf("since before mtime = %q", got)
	}
}

func TestFollowAppendTruncateClose(t *testing.T) {
	p := writeLog(t, "one\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := Open(ctx, p, Options{LogOptions: runtime.LogOptions{Follow: true}, Prefix: "serial", Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(r)
	expect := func(want string) {
		t.Helper()
		line, err := br.ReadString('\n')
		if err != nil || line != want {
			t.Fatalf("line = %q, %v; want %q", line, err, want)
		}
	}
	expect("serial one\n")
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("two\n")
	f.Close()
	expect("serial two\n")
	os.WriteFile(p, []byte("fresh\n"), 0o600) // truncated by a restart
	expect("serial fresh\n")
	done := make(chan error, 1)
	go func() { _, err := br.ReadString('\n'); done <- err }()
	r.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("read after close succeeded")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not end a pending Read")
	}
}

func TestMissingFile(t *testing.T) {
	if _, err := Open(context.Background(), filepath.Join(t.TempDir(), "nope"), Options{Prefix: "serial"}); err == nil {
		t.Fatal("missing file opened")
	}
}
