// Package sdnotifytest is a fake service manager for tests: a unixgram
// socket that collects the sd_notify datagrams a process sends.
package sdnotifytest

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Socket receives notifications.
type Socket struct {
	// Path is the socket's path: NOTIFY_SOCKET.
	Path string
	msgs chan string
}

// Listen opens a socket in a short temporary directory (socket paths are
// limited to about 100 bytes); it is closed when the test ends.
func Listen(t testing.TB) *Socket {
	t.Helper()
	dir, err := os.MkdirTemp("", "sdn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &Socket{Path: filepath.Join(dir, "notify"), msgs: make(chan string, 256)}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: s.Path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(s.msgs)
				return
			}
			s.msgs <- string(buf[:n])
		}
	}()
	return s
}

// Wait returns the first datagram, among those not read yet, that has a
// line equal to line (e.g. "READY=1"), with every datagram read on the way;
// it fails the test after timeout.
func (s *Socket) Wait(t testing.TB, line string, timeout time.Duration) (string, []string) {
	t.Helper()
	var seen []string
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-s.msgs:
			if !ok {
				t.Fatalf("notify socket closed before %q; got %q", line, seen)
			}
			seen = append(seen, m)
			for _, l := range strings.Split(m, "\n") {
				if l == line {
					return m, seen
				}
			}
		case <-deadline:
			t.Fatalf("no %q on the notify socket within %s; got %q", line, timeout, seen)
		}
	}
}

// Drain returns the datagrams received and not read yet.
func (s *Socket) Drain() []string {
	var out []string
	for {
		select {
		case m, ok := <-s.msgs:
			if !ok {
				return out
			}
			out = append(out, m)
		default:
			return out
		}
	}
}
