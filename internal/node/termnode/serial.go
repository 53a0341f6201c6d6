package termnode

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/drover-dev/drover/internal/wire/terminal"

	"github.com/drover-dev/drover/internal/wire/api"
)

// serialConsole is an instance's serial console: a Unix socket the runtime
// serves (QEMU's chardev socket). It has no size and no process; it ends
// when the socket reaches EOF.
type serialConsole struct {
	c        net.Conn
	exited   chan struct{}
	exitOnce sync.Once
}

// dialSerial connects to the serial console socket at path.
func dialSerial(ctx context.Context, path string) (console, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, &Error{api.CodedError{Code: CodePTYFailed, Message: fmt.Sprintf("cannot attach the serial console socket %s", path), Err: err}}
	}
	return &serialConsole{c: c, exited: make(chan struct{})}, nil
}

func (s *serialConsole) Read(p []byte) (int, error) {
	n, err := s.c.Read(p)
	if err != nil {
		s.exitOnce.Do(func() { close(s.exited) })
	}
	return n, err
}

func (s *serialConsole) Write(p []byte) (int, error) { return s.c.Write(p) }

// Resize does nothing: a serial line has no window size.
func (s *serialConsole) Resize(terminal.Size) error { return nil }

func (s *serialConsole) Exited() <-chan struct{} { return s.exited }

func (s *serialConsole) ExitCode() int { return 0 }

func (s *serialConsole) Stop() { _ = s.c.Close() }

func (s *serialConsole) Close() error { return s.c.Close() }

func (s *serialConsole) PID() int { return 0 }
