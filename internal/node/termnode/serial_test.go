package termnode_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// serialServer is a fake serial console: a Unix socket that answers every
// chunk it reads with "<" + chunk + ">" and reports when its client left.
type serialServer struct {
	path   string
	ln     net.Listener
	conns  chan net.Conn
	closed chan struct{} // the client's side reached EOF
}

func newSerialServer(t *testing.T) *serialServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "tn") // short: Unix socket paths are limited to ~107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "serial.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := &serialServer{path: path, ln: ln, conns: make(chan net.Conn, 1), closed: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.conns <- c
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write([]byte("<" + string(buf[:n]) + ">")); werr != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					close(s.closed)
				}
				return
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case c := <-s.conns:
			c.Close()
		default:
		}
		<-done
	})
	return s
}

func serialParams(t *testing.T) task.TerminalOpenParams {
	p := ptyParams(t, "")
	p.Mode, p.InstanceID = task.TerminalModeSerial, "inst-1"
	return p
}

func TestSerialSession(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"console EOF", "gateway closes"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			fx := newPKI(t)
			srv := newSerialServer(t)
			p := serialParams(t)
			g := newGateway(t, fx, p.Nonce)
			var asked string
			m := newManager(t, g, clientTLS(fx.pool, fx.client), func(c *termnode.Config) {
				c.SerialSocket = func(_ context.Context, id string) (string, error) { asked = id; return srv.path, nil }
			})
			var phases []string
			res, err := m.Open(context.Background(), p, "", func(phase string, _ time.Duration, _ error) { phases = append(phases, phase) })
			if err != nil {
				t.Fatal(err)
			}
			if asked != "inst-1" || res.Mode != "serial" || res.PID != 0 || strings.Join(phases, ",") != "stream_connect,serial_attach" {
				t.Fatalf("asked %q, result %+v, phases %v", asked, res, phases)
			}
			s := g.waitStream()
			if c := s.Control(5 * time.Second); c.Type != terminal.TypeReady {
				t.Fatalf("first frame %+v", c)
			}
			s.Send(terminal.ChanResize, terminal.EncodeResize(terminal.Size{Cols: 100, Rows: 40})) // ignored
			s.Stdin("login: root")
			s.ReadUntil("<login: root>", 5*time.Second)
			conn := <-srv.conns
			srv.conns <- conn
			switch end {
			case "console EOF":
				conn.Close()
				if c := untilControl(s, 5*time.Second); c.Type != terminal.TypeExit || c.ExitCode != 0 {
					t.Fatalf("want exit 0, got %+v", c)
				}
				if code := s.CloseStatus(5 * time.Second); code != websocket.StatusNormalClosure {
					t.Fatalf("close status %d", code)
				}
			case "gateway closes":
				s.Conn.Close(websocket.StatusNormalClosure, "")
				select {
				case <-srv.closed:
				case <-time.After(5 * time.Second):
					t.Fatal("the serial socket was not closed after the stream closed")
				}
			}
			waitActive(t, m, 0)
		})
	}
}

func TestSerialUnavailable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		socket func(context.Context, string) (string, error)
		msg    string
	}{
		{"no serial support", nil, "cannot attach serial consoles"},
		{"runtime error", func(context.Context, string) (string, error) { return "", errors.New("this host runs no instances") },
			"this host runs no instances"},
		{"socket missing", func(context.Context, string) (string, error) { return "/nonexistent/serial.sock", nil },
			"/nonexistent/serial.sock"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fx := newPKI(t)
			p := serialParams(t)
			g := newGateway(t, fx, p.Nonce)
			m := newManager(t, g, clientTLS(fx.pool, fx.client), func(c *termnode.Config) { c.SerialSocket = tc.socket })
			_, err := m.Open(context.Background(), p, "", nil)
			if codeOf(t, err) != termnode.CodePTYFailed || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Open: %v, want terminal_pty_failed mentioning %q", err, tc.msg)
			}
			s := g.waitStream()
			c := s.Control(5 * time.Second)
			if c.Type != terminal.TypeError || c.Error != terminal.CodePTYFailed || !strings.Contains(c.Message, tc.msg) {
				t.Fatalf("gateway got %+v", c)
			}
			if code := s.CloseStatus(5 * time.Second); int(code) != terminal.ClosePTYFailed {
				t.Fatalf("close status %d", code)
			}
		})
	}
}
