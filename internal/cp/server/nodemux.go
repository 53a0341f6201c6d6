package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// muxServer serves the node API on connections whose agent chose
// nodemux.Proto: one goroutine per connection reads frames, and each
// request runs the node API's handler on a goroutine of its own, with
// r.TLS the connection's state, so authentication, limits and every
// route are the HTTP/2 ones. A parked long-poll then costs its handler's
// goroutine, and the connection one small reader, instead of net/http's
// connection, frame-reader and handler goroutines and its per-stream
// buffers (docs/adr/0018-node-mux.md).
type muxServer struct {
	handler http.Handler
	log     *slog.Logger
	// idle closes a connection with no request in flight for this long;
	// payload bounds reading a frame's payload once its header came;
	// write bounds writing one answer; maxHead bounds a request's method,
	// target and fields; maxStreams bounds a connection's requests in
	// flight (429 beyond).
	idle, payload, write time.Duration
	maxHead, maxStreams  int

	mu     sync.Mutex
	conns  map[*muxConn]struct{}
	closed bool
}

func newMuxServer(h http.Handler, cfg Config, log *slog.Logger) *muxServer {
	return &muxServer{handler: h, log: log, idle: cfg.IdleTimeout, payload: cfg.ReadHeaderTimeout + cfg.BodyReadTimeout,
		write: cfg.ReadHeaderTimeout + cfg.BodyReadTimeout, maxHead: cfg.MaxHeaderBytes, maxStreams: muxMaxStreams,
		conns: map[*muxConn]struct{}{}}
}

// muxMaxStreams is a connection's requests in flight; HTTP/2's
// net/http default is 250, an agent uses fewer than 16.
const muxMaxStreams = 64

// serve reads c's frames until it closes; it runs on a goroutine of its
// own (started by the node listener once the handshake is done).
func (s *muxServer) serve(c *tls.Conn) {
	state := c.ConnectionState()
	ctx, cancel := context.WithCancel(context.Background())
	mc := &muxConn{s: s, nc: c, tls: &state, ctx: ctx, cancel: cancel, remote: c.RemoteAddr().String(),
		host: state.ServerName, streams: map[uint32]context.CancelFunc{}}
	if mc.host == "" {
		mc.host = "node"
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = c.Close()
		return
	}
	s.conns[mc] = struct{}{}
	s.mu.Unlock()
	err := mc.readLoop()
	mc.close()
	s.mu.Lock()
	delete(s.conns, mc)
	s.mu.Unlock()
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		s.log.Debug("node listener: framed connection closed", "remote", mc.remote, "err", err)
	}
}

// Close closes every connection; their handlers' contexts end.
func (s *muxServer) Close() {
	s.mu.Lock()
	s.closed = true
	conns := make([]*muxConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// muxConn is one framed connection.
type muxConn struct {
	s      *muxServer
	nc     *tls.Conn
	tls    *tls.ConnectionState // shared, read-only, by every request
	ctx    context.Context      // ends when the connection closes
	cancel context.CancelFunc
	remote string
	host   string
	wmu    sync.Mutex // one answer at a time

	mu       sync.Mutex
	streams  map[uint32]context.CancelFunc // requests in flight
	midFrame bool                          // the reader is reading a payload, under its deadline
}

func (c *muxConn) close() {
	c.cancel()
	_ = c.nc.Close()
}

// readLoop reads frames until the connection fails or breaks the framing.
// It keeps its own frames shallow: each request is served on a goroutine
// of its own.
func (c *muxConn) readLoop() error {
	var hdr [nodemux.HeaderLen]byte
	c.armIdle()
	for {
		f, n, err := nodemux.ReadHeader(c.nc, &hdr, nodemux.MaxPayload)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.midFrame = true // armIdle leaves the payload's deadline alone
		if c.s.payload > 0 && n > 0 {
			_ = c.nc.SetReadDeadline(time.Now().Add(c.s.payload))
		}
		c.mu.Unlock()
		if err := nodemux.ReadPayload(c.nc, &f, n); err != nil {
			return err
		}
		c.mu.Lock()
		c.midFrame = false
		_ = c.nc.SetReadDeadline(time.Time{})
		c.mu.Unlock()
		switch f.Type {
		case nodemux.TypeRequest:
			if err := c.start(f); err != nil {
				return err
			}
		case nodemux.TypeCancel:
			c.mu.Lock()
			if cancel := c.streams[f.Stream]; cancel != nil {
				cancel()
			}
			c.mu.Unlock()
		default:
			return fmt.Errorf("%w: frame type %d from the agent", nodemux.ErrProtocol, f.Type)
		}
		c.armIdle()
	}
}

// armIdle sets the read deadline to the idle timeout when nothing is in
// flight (the reader is then waiting for the next request, or for the
// agent to go away).
func (c *muxConn) armIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.streams) == 0 && c.s.idle > 0 && !c.midFrame {
		_ = c.nc.SetReadDeadline(time.Now().Add(c.s.idle))
	}
}

// start begins serving a request frame.
func (c *muxConn) start(f nodemux.Frame) error {
	req, err := nodemux.ParseRequest(f.Payload)
	if err != nil {
		return err
	}
	h := c.s.handler
	if headLen := len(f.Payload) - len(req.Body); c.s.maxHead > 0 && headLen > c.s.maxHead {
		h = c.s.refusal(httpapi.Errorf(http.StatusRequestHeaderFieldsTooLarge, "header_too_large",
			"request method, target and header fields of %d bytes (at most %d)", headLen, c.s.maxHead))
	}
	c.mu.Lock()
	if _, dup := c.streams[f.Stream]; dup {
		c.mu.Unlock()
		return fmt.Errorf("%w: stream %d already in flight", nodemux.ErrProtocol, f.Stream)
	}
	if len(c.streams) >= 2*c.s.maxStreams { // refusals pile up too: an agent that does not read them
		c.mu.Unlock()
		return fmt.Errorf("%w: %d requests in flight", nodemux.ErrProtocol, len(c.streams))
	}
	if len(c.streams) >= c.s.maxStreams {
		h = c.s.refusal(&httpapi.Error{Status: http.StatusTooManyRequests, RetryAfter: 1,
			CodedError: api.CodedError{Code: "node_mux_stream_limit",
				Message: fmt.Sprintf("more than %d requests in flight on one connection", c.s.maxStreams)}})
	}
	ctx, cancel := context.WithCancel(c.ctx)
	c.streams[f.Stream] = cancel
	_ = c.nc.SetReadDeadline(time.Time{}) // in flight: no idle deadline
	c.mu.Unlock()
	st := &muxStream{c: c, ctx: ctx, id: f.Stream, req: req, h: h}
	go st.serve()
	return nil
}

// refusal is a handler that answers err (with a correlation id, as the
// node API's own refusals).
func (s *muxServer) refusal(err error) http.Handler {
	return httpapi.WithCorrelation(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(s.log, w, r, err)
	}))
}

// muxStream is one request in flight. Its goroutine parks in the handler
// for as long as a long-poll waits, so the frames below the handler are
// kept small (serve): the GC halves a parked goroutine's 8 KiB stack
// only while its frames use under ≈ 1.2 KB (docs/performance.md, "Memory
// per idle long-poll").
type muxStream struct {
	c   *muxConn
	ctx context.Context
	id  uint32
	req nodemux.Request
	h   http.Handler
	r   *http.Request
	w   muxWriter
}

func (st *muxStream) serve() {
	defer st.end()
	st.w.header = http.Header{}
	if st.r = st.request(); st.r == nil {
		st.w.aborted = true
		return
	}
	st.h.ServeHTTP(&st.w, st.r)
}

// end is deferred by serve: it recovers a handler's panic (aborting the
// stream; logged unless it is http.ErrAbortHandler) and finishes the
// stream.
//
//go:noinline
func (st *muxStream) end() {
	if p := recover(); p != nil {
		st.w.aborted = true
		if p != http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
			target := ""
			if st.r != nil {
				target = st.r.Method + " " + st.r.URL.Path
			}
			st.c.s.log.Error("node API handler panicked", "remote", st.c.remote, "request", target, "panic", p)
		}
	}
	st.c.finish(st.ctx, st.id, &st.w)
}

// request is the stream's *http.Request: r.TLS the connection's state, so
// the node API authenticates it as over HTTP/2. Nil for a target that is
// not a URL (ParseRequest let it through).
//
//go:noinline
func (st *muxStream) request() *http.Request {
	c := st.c
	var body io.Reader = http.NoBody
	if len(st.req.Body) > 0 {
		body = bytes.NewReader(st.req.Body)
	}
	r, err := http.NewRequestWithContext(st.ctx, st.req.Method, "https://"+c.host+st.req.Target, body)
	if err != nil {
		c.s.log.Debug("node listener: framed request target", "remote", c.remote, "err", err)
		return nil
	}
	r.Header, r.RequestURI, r.RemoteAddr, r.TLS = st.req.Header, st.req.Target, c.remote, c.tls
	r.Proto, r.ProtoMajor, r.ProtoMinor = nodemux.Proto, 1, 0
	st.req = nodemux.Request{}
	return r
}

// finish sends a request's answer (unless the agent cancelled it) and ends
// its stream. A handler that panicked closes the connection, as net/http
// resets its stream: the agent's request fails instead of waiting.
func (c *muxConn) finish(ctx context.Context, stream uint32, w *muxWriter) {
	c.mu.Lock()
	cancel := c.streams[stream]
	delete(c.streams, stream)
	c.mu.Unlock()
	cancelled := ctx.Err() != nil
	if cancel != nil {
		cancel()
	}
	if w.aborted {
		c.close()
		return
	}
	if !cancelled {
		c.answer(stream, w)
	}
	c.armIdle()
}

// answer writes w as stream's answer frame; a write that fails or does
// not finish in time closes the connection.
func (c *muxConn) answer(stream uint32, w *muxWriter) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	frame := nodemux.AppendResponse(make([]byte, 0, nodemux.HeaderLen+256+w.body.Len()), stream, w.status, w.header, w.body.Bytes())
	if len(frame)-nodemux.HeaderLen > nodemux.MaxPayload {
		cid := w.header.Get(api.HeaderCorrelationID)
		c.s.log.Error("node API answer too large for a frame", "remote", c.remote, "bytes", w.body.Len(), "correlation_id", cid)
		body, _ := json.Marshal(api.ErrorBody{Error: api.ErrorDetail{Code: "response_too_large", CorrelationID: cid,
			Message: fmt.Sprintf("answer of %d bytes, over the %d a drover-mux/1 frame carries", w.body.Len(), nodemux.MaxPayload)}})
		frame = nodemux.AppendResponse(nil, stream, http.StatusInternalServerError,
			http.Header{"Content-Type": {"application/json"}, api.HeaderCorrelationID: {cid}}, body)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.s.write > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.write))
	}
	if _, err := c.nc.Write(frame); err != nil {
		c.close()
	}
}

// muxWriter is a request's http.ResponseWriter: the answer is sent whole
// when the handler returns.
type muxWriter struct {
	header  http.Header
	status  int
	body    bytes.Buffer
	aborted bool
}

func (w *muxWriter) Header() http.Header { return w.header }

func (w *muxWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
}

func (w *muxWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}
