// Package termnode owns the node end of a terminal session: dialing the
// gateway's node-facing stream over mTLS, the PTY (a login shell as the
// allocation's user), an instance's serial console or a brokered SSH
// session into a slice VM (vmssh.go), and the byte pump
// between them, with backpressure, resizes, keepalives, the session's
// maximum lifetime and the shell's end.
//
// It must not decide who may open a terminal: the signed terminal.open task
// does, and the gateway checks the node's certificate and the session nonce.
// It never starts a shell without a stream to the gateway, never drops
// bytes, and never outlives Close: every session it started is ended and
// its shell reaped.
package termnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Error codes of Open's *Error. The first three are terminal.ErrorCode
// values the gateway shows as they are; the others are task result codes.
const (
	CodePTYFailed            = string(terminal.CodePTYFailed)
	CodeNodeStreamMTLSFailed = string(terminal.CodeNodeStreamMTLSFailed)
	CodeNodeStreamTimeout    = string(terminal.CodeNodeStreamTimeout)
	// CodeSessionRejected: the gateway refused the stream (HTTP 403, 404,
	// 409 or 410 with its own error code in the message: wrong node, nonce
	// mismatch, unknown or closed session, stream exists).
	CodeSessionRejected = "terminal_session_rejected"
	// CodeInvalidParams: the params cannot describe a session.
	CodeInvalidParams = "invalid_params"
	// CodeShuttingDown: Open was called after Close.
	CodeShuttingDown = "agent_shutdown"
)

// Defaults of Config.
const (
	DefaultDialTimeout  = 10 * time.Second
	DefaultPingInterval = 15 * time.Second
)

// Tunables of a session that the contract fixes.
const (
	// maxChunk bounds one PTY read, hence one stdout frame's payload.
	maxChunk = 32 << 10
	// readLimit bounds one message from the gateway.
	readLimit = 1 << 20
	// drainIdle: after the shell exited, output is drained until the PTY
	// has had nothing to read for this long (a background job may keep the
	// PTY open after the shell is gone).
	drainIdle = 500 * time.Millisecond
	// writeTimeout bounds a control message or close handshake at the end.
	writeTimeout = 5 * time.Second
)

// Config configures a Manager.
type Config struct {
	// NodeID is this node's id, the {node_id} of the stream URL.
	NodeID string
	// BaseURL is the gateway's node-facing base URL
	// (NODE_AGENT_TERMINAL_URL), e.g. https://cp:8443.
	BaseURL string
	// TLSConfig returns the agent's current mTLS client configuration; it
	// is cloned for every dial (its GetClientCertificate keeps renewals
	// working). nil, or a nil result, fails with
	// terminal_node_stream_mtls_failed.
	TLSConfig func() *tls.Config
	// SerialSocket returns the Unix socket of an instance's serial
	// console; nil means serial mode is not supported here.
	SerialSocket func(ctx context.Context, instanceID string) (string, error)
	// VMTarget returns slice VM vm's brokered-terminal target for a
	// session of allocationID, from the node's own provision records; it
	// must refuse a VM another allocation owns (an *Error with
	// CodeGuestNotOwned). nil means mode vm_ssh is not supported here.
	VMTarget func(ctx context.Context, vm, allocationID string) (VMTarget, error)
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// DialTimeout bounds the stream dial (TCP, TLS, upgrade);
	// DefaultDialTimeout when zero.
	DialTimeout time.Duration
	// PingInterval is the WebSocket ping period on the stream;
	// DefaultPingInterval when zero. A ping unanswered for two periods
	// ends the session.
	PingInterval time.Duration
}

// Result is what a successful Open reports (the task's output).
type Result struct {
	SessionID       string `json:"session_id"`
	Mode            string `json:"mode"`
	PID             int    `json:"pid,omitempty"`
	StreamConnectMS int64  `json:"stream_connect_ms"`
	PTYStartMS      int64  `json:"pty_start_ms,omitempty"`
	SerialAttachMS  int64  `json:"serial_attach_ms,omitempty"`
}

// Error is an Open failure with a stable code (see the Code constants).
type Error struct {
	api.CodedError // Error() is "code: message[: cause]"
}

// CodeOf returns the code of an *Error in err's chain, or "".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Manager opens terminal sessions and ends them all on Close.
type Manager struct {
	cfg        Config
	log        *slog.Logger
	passwdFile string          // where login shells are looked up (tests replace it)
	ctx        context.Context // ends every session
	cancel     context.CancelFunc

	mu     sync.Mutex
	closed bool
	active map[string]struct{}
	wg     sync.WaitGroup
}

// New returns a Manager; it contacts nobody.
func New(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{cfg: cfg, log: cfg.Logger, passwdFile: passwdFile, ctx: ctx, cancel: cancel, active: map[string]struct{}{}}
}

// Active returns the number of sessions running now.
func (m *Manager) Active() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.active)
}

// Close ends every session (each gets an error node_offline frame, its
// shell SIGHUP then SIGKILL) and waits until they are gone. Open fails
// afterwards.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
}

// Open dials the gateway's stream for session p.SessionID, then starts the
// PTY (mode pty), attaches the serial console (mode serial) or opens the
// SSH session and its PTY in a slice VM (mode vm_ssh), sends the
// control message ready and returns; the session runs in the background
// until the shell exits, the gateway closes the stream, p.MaxLifetime
// passes or Close is called. ctx bounds only the opening. progress, when
// not nil, reports the phases "stream_connect" and "pty_start" or
// "serial_attach". A failure is an *Error; once the stream is connected, a
// console failure is also sent to the gateway as an error frame.
func (m *Manager) Open(ctx context.Context, p task.TerminalOpenParams, correlationID string,
	progress func(phase string, d time.Duration, err error)) (Result, error) {
	if progress == nil {
		progress = func(string, time.Duration, error) {}
	}
	res := Result{SessionID: p.SessionID, Mode: p.Mode}
	if err := checkParams(p); err != nil {
		return res, err
	}
	log := m.log.With("session_id", p.SessionID, "correlation_id", correlationID,
		"allocation_id", p.AllocationID, "mode", p.Mode)
	if err := m.reserve(p.SessionID); err != nil {
		return res, err
	}
	// Close also cancels an Open in progress.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.ctx, cancel)()
	started := false
	defer func() {
		if !started {
			m.release(p.SessionID)
		}
	}()

	start := time.Now()
	conn, err := m.dial(ctx, p, correlationID)
	d := time.Since(start)
	res.StreamConnectMS = d.Milliseconds()
	progress("stream_connect", d, err)
	if err != nil {
		log.Warn("terminal stream dial failed", "code", CodeOf(err), "err", err, "duration_ms", d.Milliseconds())
		return res, err
	}
	log.Info("terminal stream connected", "duration_ms", d.Milliseconds())

	phase := "pty_start"
	if p.Mode == task.TerminalModeSerial {
		phase = "serial_attach"
	}
	start = time.Now()
	con, err := m.startConsole(ctx, p)
	d = time.Since(start)
	progress(phase, d, err)
	if err != nil {
		log.Error("terminal console failed", "phase", phase, "err", err)
		msg := err.Error()
		var te *Error
		if errors.As(err, &te) {
			msg = te.Message
			if te.Err != nil {
				msg += ": " + te.Err.Error()
			}
			if strings.HasPrefix(te.Code, "guest_") {
				msg = te.Code + ": " + msg // the hop that failed (vm_ssh's guest_* codes)
			}
		}
		failStream(conn, terminal.CodePTYFailed, msg)
		return res, err
	}
	if p.Mode == task.TerminalModeSerial {
		res.SerialAttachMS = d.Milliseconds()
	} else {
		res.PTYStartMS = d.Milliseconds()
	}
	res.PID = con.PID()
	log.Info("terminal console started", "phase", phase, "pid", res.PID, "duration_ms", d.Milliseconds())

	if err := writeControl(ctx, conn, terminal.Ready(p.SessionID)); err != nil {
		con.Stop()
		_ = con.Close()
		_ = conn.CloseNow()
		return res, &Error{api.CodedError{Code: CodeNodeStreamTimeout, Message: "the stream broke before ready was sent", Err: err}}
	}
	s := newSession(m, p, conn, con, log)
	started = true
	go func() {
		defer m.release(p.SessionID)
		s.run()
	}()
	return res, nil
}

// checkParams rejects params that cannot describe a session (the handler
// decodes them strictly with task.DecodeTerminalOpenParams first).
func checkParams(p task.TerminalOpenParams) error {
	bad := func(format string, args ...any) error {
		return &Error{api.CodedError{Code: CodeInvalidParams, Message: fmt.Sprintf(format, args...)}}
	}
	switch {
	case p.SessionID == "":
		return bad("session_id is required")
	case p.Nonce == "":
		return bad("nonce is required")
	case p.MaxLifetime <= 0:
		return bad("max_lifetime must be positive")
	case p.Cols < 1 || p.Rows < 1:
		return bad("cols and rows must be positive")
	}
	switch p.Mode {
	case task.TerminalModePTY:
		if p.Username == "" {
			return bad("username is required in mode pty")
		}
	case task.TerminalModeSerial:
		if p.InstanceID == "" {
			return bad("instance_id is required in mode serial")
		}
	case task.TerminalModeVMSSH:
		if p.Username == "" || p.VMName == "" || p.AllocationID == "" {
			return bad("username, vm_name and allocation_id are required in mode vm_ssh")
		}
	default:
		return bad("mode %q: must be %q, %q or %q", p.Mode, task.TerminalModePTY, task.TerminalModeSerial, task.TerminalModeVMSSH)
	}
	return nil
}

// reserve registers a session about to open; it fails after Close and for
// a session id already running here.
func (m *Manager) reserve(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return &Error{api.CodedError{Code: CodeShuttingDown, Message: "the agent is shutting down"}}
	}
	if _, dup := m.active[id]; dup {
		return &Error{api.CodedError{Code: CodeSessionRejected, Message: "terminal session " + id + " already runs on this node"}}
	}
	m.active[id] = struct{}{}
	m.wg.Add(1)
	return nil
}

func (m *Manager) release(id string) {
	m.mu.Lock()
	delete(m.active, id)
	m.mu.Unlock()
	m.wg.Done()
}

// startConsole starts the PTY or attaches the serial console.
func (m *Manager) startConsole(ctx context.Context, p task.TerminalOpenParams) (console, error) {
	size, err := terminal.Clamp(terminal.Size{Cols: uint16(min(p.Cols, terminal.MaxCols)), Rows: uint16(min(p.Rows, terminal.MaxRows))})
	if err != nil {
		return nil, &Error{api.CodedError{Code: CodeInvalidParams, Message: err.Error()}}
	}
	if p.Mode == task.TerminalModeSerial {
		if m.cfg.SerialSocket == nil {
			return nil, &Error{api.CodedError{Code: CodePTYFailed, Message: "this agent cannot attach serial consoles"}}
		}
		path, err := m.cfg.SerialSocket(ctx, p.InstanceID)
		if err != nil {
			return nil, &Error{api.CodedError{Code: CodePTYFailed, Message: fmt.Sprintf("serial console of instance %q: %v", p.InstanceID, err), Err: err}}
		}
		return dialSerial(ctx, path)
	}
	if p.Mode == task.TerminalModeVMSSH {
		return m.startVMSSH(ctx, p.VMName, p.AllocationID, p.Username, size)
	}
	return startPTY(p.Username, size, m.passwdFile)
}
