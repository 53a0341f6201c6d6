// Package lognode is the agent's end of a workload's log stream
// (logs.open): it opens the instance's log through the runtime's
// LogReader (the instance is looked up in the agent's own runtime; no path
// ever comes from the task), dials the control plane's node-facing logs
// stream with the node certificate and the session's nonce (the
// terminal's dialer, termnode.DialStream), and copies the log line by
// line as logstream frames. Memory is bounded: one read buffer of
// logstream.MaxLine and one frame in flight per stream. A slow control
// plane blocks the WebSocket write, which stops the reads from the log
// (backpressure); the control plane closing the stream, the stream's
// maximum lifetime or the agent stopping closes the log reader.
package lognode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/logstream"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Error codes of Open's *Error.
const (
	// CodeInstanceUnknown: this node's runtime does not know the instance.
	CodeInstanceUnknown = "logs_instance_unknown"
	// CodeUnsupported: this node's runtime cannot read logs.
	CodeUnsupported = "logs_unsupported"
	// CodeReadFailed: the runtime could not open the log.
	CodeReadFailed = "logs_read_failed"
	// CodeStreamLimit: the node already sends MaxStreams log streams.
	CodeStreamLimit = "logs_node_stream_limit"
	// CodeNodeStreamTimeout, CodeNodeStreamMTLSFailed and
	// CodeSessionRejected: the dial failed at that hop (see termnode).
	CodeNodeStreamTimeout    = "logs_node_stream_timeout"
	CodeNodeStreamMTLSFailed = "logs_node_stream_mtls_failed"
	CodeSessionRejected      = "logs_session_rejected"
	// CodeShuttingDown: the agent is stopping.
	CodeShuttingDown = "agent_shutdown"
)

// Defaults.
const (
	DefaultMaxStreams  = 32
	DefaultDialTimeout = 10 * time.Second
	writeTimeout       = 5 * time.Second
)

// Source opens an instance's log (the agent's runtime, checked).
type Source func(ctx context.Context, instanceID string, opts runtime.LogOptions) (io.ReadCloser, error)

// ErrUnsupported is wrapped by a Source whose runtime has no LogReader
// (it is the Router's runtime.ErrLogsUnsupported, for a routed runtime
// without one).
var ErrUnsupported = runtime.ErrLogsUnsupported

// Config configures a Manager.
type Config struct {
	NodeID string
	// BaseURL is the control plane's node-facing base URL (the agent's
	// NODE_AGENT_TERMINAL_URL, by default its control plane URL).
	BaseURL string
	// TLSConfig returns the agent's current mTLS client configuration.
	TLSConfig func() *tls.Config
	Source    Source
	Logger    *slog.Logger
	// MaxStreams caps concurrent streams (DefaultMaxStreams when zero).
	MaxStreams int
	// DialTimeout bounds the dial (DefaultDialTimeout when zero).
	DialTimeout time.Duration
}

// Result is what a successful Open reports (the task's output).
type Result struct {
	SessionID       string `json:"session_id"`
	InstanceID      string `json:"instance_id"`
	StreamConnectMS int64  `json:"stream_connect_ms"`
}

// Error is an Open failure with a stable code.
type Error struct {
	api.CodedError
}

func coded(code, msg string, err error) *Error {
	return &Error{api.CodedError{Code: code, Message: msg, Err: err}}
}

// Manager runs log streams and ends them all on Close.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	active int
	wg     sync.WaitGroup
}

// New returns a Manager; it contacts nobody.
func New(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel}
}

// Active is the number of streams running.
func (m *Manager) Active() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.active
}

// Close ends every stream (end frame agent_shutdown) and waits for them.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
}

func (m *Manager) acquire() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return coded(CodeShuttingDown, "the agent is stopping", nil)
	case m.active >= m.cfg.MaxStreams:
		return coded(CodeStreamLimit, fmt.Sprintf("this node already sends %d log streams", m.cfg.MaxStreams), nil)
	}
	m.active++
	m.wg.Add(1)
	return nil
}

func (m *Manager) release() {
	m.mu.Lock()
	m.active--
	m.mu.Unlock()
	m.wg.Done()
}

// Open opens p's log, dials its stream and starts copying; it returns once
// the stream is connected. The stream then runs until the control plane
// closes it, the log ends (no follow), p.MaxLifetime passes or Close.
func (m *Manager) Open(ctx context.Context, p task.LogsOpenParams, cid string) (Result, error) {
	res := Result{SessionID: p.SessionID, InstanceID: p.InstanceID}
	if err := m.acquire(); err != nil {
		return res, err
	}
	started := false
	defer func() {
		if !started {
			m.release()
		}
	}()
	if m.cfg.Source == nil {
		return res, coded(CodeUnsupported, "this host runs no instances", nil)
	}
	sctx, cancel := context.WithTimeout(m.ctx, time.Duration(p.MaxLifetime))
	opts := runtime.LogOptions{Follow: p.Follow, Tail: p.Tail}
	if p.Since != nil {
		opts.Since = *p.Since
	}
	rc, err := m.cfg.Source(sctx, p.InstanceID, opts)
	if err != nil {
		cancel()
		switch {
		case errors.Is(err, runtime.ErrNotFound):
			return res, coded(CodeInstanceUnknown, fmt.Sprintf("instance %q does not run on this node", p.InstanceID), err)
		case errors.Is(err, ErrUnsupported):
			return res, coded(CodeUnsupported, err.Error(), err)
		}
		return res, coded(CodeReadFailed, fmt.Sprintf("open the log of instance %q", p.InstanceID), err)
	}
	t0 := time.Now()
	conn, err := m.dial(ctx, p, cid)
	if err != nil {
		rc.Close()
		cancel()
		return res, err
	}
	res.StreamConnectMS = time.Since(t0).Milliseconds()
	started = true
	log := m.log.With("session_id", p.SessionID, "instance_id", p.InstanceID, "correlation_id", cid)
	go func() {
		defer m.release()
		defer cancel()
		n, end := copyLog(sctx, m.ctx, conn, rc)
		log.Info("log stream ended", "reason", end.Reason, "code", end.Code, "frames", n)
	}()
	return res, nil
}

// dial opens the stream with the terminal's dialer; its codes are mapped
// to the logs codes.
func (m *Manager) dial(ctx context.Context, p task.LogsOpenParams, cid string) (*websocket.Conn, error) {
	// The signed params name the replica that holds the stream; the
	// configured URL is the fallback for control planes that do not say.
	baseURL := m.cfg.BaseURL
	if p.StreamURL != "" {
		baseURL = p.StreamURL
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "wss") || u.Host == "" || m.cfg.NodeID == "" {
		return nil, coded(CodeNodeStreamTimeout, fmt.Sprintf("cannot build the logs stream URL from %q", baseURL), err)
	}
	var base *tls.Config
	if m.cfg.TLSConfig != nil {
		base = m.cfg.TLSConfig()
	}
	hdr := http.Header{}
	hdr.Set(logstream.HeaderNonce, p.Nonce)
	conn, err := termnode.DialStream(ctx, termnode.StreamDial{URL: nodeapi.LogsURL(u, m.cfg.NodeID, p.SessionID),
		TLSConfig: base, Header: hdr, CorrelationID: cid, Subprotocol: logstream.Subprotocol, Timeout: m.cfg.DialTimeout})
	if err != nil {
		var te *termnode.Error
		if !errors.As(err, &te) {
			return nil, coded(CodeNodeStreamTimeout, "dial the logs stream", err)
		}
		code := CodeNodeStreamTimeout
		switch te.Code {
		case termnode.CodeNodeStreamMTLSFailed:
			code = CodeNodeStreamMTLSFailed
		case termnode.CodeSessionRejected:
			code = CodeSessionRejected
		case termnode.CodeShuttingDown:
			code = CodeShuttingDown
		}
		return nil, &Error{api.CodedError{Code: code, Message: te.Message, Err: err}}
	}
	conn.SetReadLimit(1024) // the control plane sends only the close handshake
	return conn, nil
}
