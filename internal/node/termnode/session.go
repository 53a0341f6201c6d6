package termnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// console is the far end of a session: a shell in a PTY or a serial
// console socket.
type console interface {
	// Read returns output (stdout and stderr merged); it fails once the
	// console is gone or closed.
	Read(p []byte) (int, error)
	// Write sends input.
	Write(p []byte) (int, error)
	// Resize sets the window size; a serial console ignores it.
	Resize(terminal.Size) error
	// Exited is closed once the far end ended on its own or was stopped:
	// the shell exited, or the serial socket reached EOF.
	Exited() <-chan struct{}
	// ExitCode is the shell's exit status, 128+signal when a signal killed
	// it, 0 for a serial console; valid once Exited is closed.
	ExitCode() int
	// Stop ends the far end and waits for it: SIGHUP to the shell's
	// process group, SIGKILL after killGrace, reaped; a serial socket is
	// closed. It is idempotent.
	Stop()
	// Close releases the PTY master or the socket, unblocking Read.
	Close() error
	// PID is the shell's process id; 0 for a serial console.
	PID() int
}

// session pumps bytes between one stream and one console until either
// ends, the lifetime passes or the Manager closes.
type session struct {
	m           *Manager
	log         *slog.Logger
	conn        *websocket.Conn
	con         console
	maxLifetime time.Duration
	started     time.Time

	ctx    context.Context // the pumps' context; cancelled when the session ends
	cancel context.CancelFunc

	outDone   chan struct{} // the output pump returned
	gone      chan struct{} // the stream failed or the gateway closed it
	goneOnce  sync.Once
	goneErr   error
	readSince atomic.Int64 // UnixNano when the output pump entered Read; 0 outside Read
	bytesOut  atomic.Int64
	bytesIn   atomic.Int64
}

func newSession(m *Manager, p task.TerminalOpenParams, conn *websocket.Conn, con console, log *slog.Logger) *session {
	ctx, cancel := context.WithCancel(context.Background())
	return &session{m: m, log: log, conn: conn, con: con, maxLifetime: time.Duration(p.MaxLifetime),
		started: time.Now(), ctx: ctx, cancel: cancel, outDone: make(chan struct{}), gone: make(chan struct{})}
}

// markGone records that the stream is no longer usable.
func (s *session) markGone(err error) {
	s.goneOnce.Do(func() {
		s.goneErr = err
		close(s.gone)
	})
}

// run is the session's life; it returns once every goroutine it started
// has returned and the console is stopped and closed.
func (s *session) run() {
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); s.pumpOut() }()
	go func() { defer wg.Done(); s.pumpIn() }()
	go func() { defer wg.Done(); s.pinger() }()

	lifetime := time.NewTimer(s.maxLifetime)
	defer lifetime.Stop()
	var reason string
	select {
	case <-s.con.Exited():
		reason = s.endExited()
	case <-s.gone:
		reason = "stream_closed"
		s.log.Info("terminal stream closed; ending the shell", "err", s.goneErr)
		s.con.Stop()
	case <-lifetime.C:
		reason = string(terminal.CodeSessionMaxLifetime)
		s.endWithError(terminal.CodeSessionMaxLifetime,
			fmt.Sprintf("the session reached its maximum lifetime of %s", s.maxLifetime))
	case <-s.m.ctx.Done():
		reason = "agent_shutdown"
		s.endWithError(terminal.CodeNodeOffline, "the node agent is shutting down")
	}
	s.cancel()
	_ = s.conn.CloseNow()
	_ = s.con.Close()
	wg.Wait()
	s.log.Info("terminal session ended", "reason", reason, "exit_code", s.con.ExitCode(),
		"duration_ms", time.Since(s.started).Milliseconds(), "bytes_out", s.bytesOut.Load(), "bytes_in", s.bytesIn.Load())
}

// endExited drains the output after the shell exited, then sends exit and
// closes the stream normally.
func (s *session) endExited() string {
	s.drain()
	select {
	case <-s.gone:
		s.con.Stop()
		return "stream_closed"
	default:
	}
	code := s.con.ExitCode()
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if err := writeControl(ctx, s.conn, terminal.Exit(code)); err != nil {
		s.log.Warn("terminal exit not delivered", "err", err)
	} else {
		_ = s.conn.Close(websocket.StatusNormalClosure, "")
	}
	s.con.Stop() // what is left of the shell's process group
	return "exit"
}

// drain waits until the output pump has read everything the shell wrote.
// A background job may hold the PTY open after the shell is gone: once the
// pump has waited drainIdle for output, the console is closed.
func (s *session) drain() {
	t := time.NewTicker(drainIdle / 5)
	defer t.Stop()
	for {
		select {
		case <-s.outDone:
			return
		case <-s.gone:
			return
		case <-t.C:
			if since := s.readSince.Load(); since != 0 && time.Since(time.Unix(0, since)) >= drainIdle {
				_ = s.con.Close()
				select {
				case <-s.outDone:
				case <-s.gone:
				}
				return
			}
		}
	}
}

// endWithError tells the gateway why the session ends, closes the stream
// with the code's close code and stops the console.
func (s *session) endWithError(code terminal.ErrorCode, msg string) {
	s.log.Info("ending terminal session", "code", code, "message", msg)
	failStream(s.conn, code, msg)
	s.con.Stop()
}

// pumpOut copies console output to the stream, one blocking write per read
// of at most maxChunk bytes: a slow reader stalls the console, nothing is
// dropped.
func (s *session) pumpOut() {
	defer close(s.outDone)
	buf := make([]byte, maxChunk)
	for {
		s.readSince.Store(time.Now().UnixNano())
		n, err := s.con.Read(buf)
		s.readSince.Store(0)
		if n > 0 {
			if werr := s.conn.Write(s.ctx, websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, buf[:n])); werr != nil {
				s.markGone(fmt.Errorf("write stdout: %w", werr))
				return
			}
			s.bytesOut.Add(int64(n))
		}
		if err != nil {
			return
		}
	}
}

// pumpIn handles what the gateway sends: stdin, resizes and control pings.
// It is also the stream's reader, which WebSocket pings and the close
// handshake need.
func (s *session) pumpIn() {
	for {
		typ, msg, err := s.conn.Read(s.ctx)
		if err != nil {
			s.markGone(err)
			return
		}
		if typ != websocket.MessageBinary {
			s.log.Warn("terminal stream: ignoring a text message")
			continue
		}
		ch, payload, err := terminal.Decode(msg)
		if err != nil {
			s.log.Warn("terminal stream: ignoring a bad frame", "err", err)
			continue
		}
		switch ch {
		case terminal.ChanStdin:
			if _, err := s.con.Write(payload); err != nil {
				s.log.Debug("terminal input not delivered", "err", err)
				continue
			}
			s.bytesIn.Add(int64(len(payload)))
		case terminal.ChanResize:
			size, err := terminal.DecodeResize(payload)
			if err != nil {
				s.log.Warn("terminal stream: ignoring a bad resize", "err", err)
				continue
			}
			if err := s.con.Resize(size); err != nil {
				s.log.Warn("terminal resize failed", "size", size.String(), "err", err)
			}
		case terminal.ChanControl:
			c, err := terminal.DecodeControl(payload)
			if err != nil {
				s.log.Warn("terminal stream: ignoring a bad control message", "err", err)
				continue
			}
			if c.Type == terminal.TypePing {
				ctx, cancel := context.WithTimeout(s.ctx, writeTimeout)
				err := writeControl(ctx, s.conn, terminal.Pong())
				cancel()
				if err != nil && !errors.Is(err, context.Canceled) {
					s.log.Debug("terminal pong not sent", "err", err)
				}
			}
		default:
			s.log.Warn("terminal stream: ignoring a frame on channel " + ch.String())
		}
	}
}

// pinger sends a WebSocket ping every PingInterval; a pong missing for two
// intervals means the gateway is gone.
func (s *session) pinger() {
	every := s.m.cfg.PingInterval
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.gone:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, 2*every)
		err := s.conn.Ping(ctx)
		cancel()
		if err != nil {
			if s.ctx.Err() == nil {
				s.markGone(fmt.Errorf("ping: %w", err))
			}
			return
		}
	}
}
