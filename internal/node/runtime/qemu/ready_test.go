package qemu

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMarkerTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serial.log")
	appendTo := func(s string) {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
	}
	m := &markerTail{path: path, marker: []byte("READY-42")}
	if m.found() {
		t.Fatal("found in a missing file")
	}
	appendTo("boot... READY-")
	if m.found() {
		t.Fatal("found half a marker")
	}
	appendTo("4")
	if m.found() {
		t.Fatal("found a partial marker")
	}
	appendTo("2\n")
	if !m.found() {
		t.Fatal("marker split over three writes not found")
	}

	// Only bytes after the start offset count.
	m2 := &markerTail{path: path, off: int64(len("boot... READY-42\n")), marker: []byte("READY-42")}
	if m2.found() {
		t.Fatal("a marker from the previous run was found")
	}
	appendTo("again READY-42")
	if !m2.found() {
		t.Fatal("marker after the offset not found")
	}

	// A truncated file is read from its start.
	if err := os.WriteFile(path, []byte("READY-42"), 0o600); err != nil {
		t.Fatal(err)
	}
	m3 := &markerTail{path: path, off: 1 << 20, marker: []byte("READY-42")}
	if !m3.found() {
		t.Fatal("marker in a truncated file not found")
	}
}

func TestEstablishedTo(t *testing.T) {
	table := `Hub -1 (n0):
  Protocol[State]    FD  Source Address  Port   Dest. Address  Port RecvQ SendQ
  TCP[SYN_SENT]      12       127.0.0.1  5555       10.0.2.15    22     0     0
  TCP[ESTABLISHED]   14       127.0.0.1  5556       10.0.2.15  8080     0     0
  TCP[HOST_FORWARD]   8       127.0.0.1  5555       10.0.2.15    22     0     0
`
	tests := []struct {
		port int
		want bool
	}{{22, false}, {8080, true}, {80, false}}
	for _, tc := range tests {
		if got := establishedTo(table, tc.port); got != tc.want {
			t.Errorf("establishedTo(%d) = %v, want %v", tc.port, got, tc.want)
		}
	}
}
