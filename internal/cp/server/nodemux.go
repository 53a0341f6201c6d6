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
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// muxServer serves the node API on connections whose agent chose
// nodemux.Proto. Each request runs the node API's handler with r.TLS the
// connection's state, so authentication, limits and every route are the
// HTTP/2 ones. On Linux a connection is read only when it is readable
// (muxPoller, muxConn.burst), and the node's long-polls (tasks, desired
// instances) park without their handlers' goroutines (httpapi.Parker): an
// idle agent then costs no goroutine at all, instead of net/http's
// connection, frame-reader and handler goroutines and its per-stream
// buffers (docs/adr/0018-node-mux.md, 0019). Elsewhere each connection
// has a reader goroutine (readLoop).
type muxServer struct {
	handler http.Handler
	log     *slog.Logger
	poll    *muxPoller // nil: a reader goroutine per connection
	// idle closes a connection with no request in flight for this long;
	// payload bounds reading a frame's payload once its header came;
	// write bounds writing one answer; maxHead bounds a request's method,
	// target and fields; maxStreams bounds a connection's requests in
	// flight (429 beyond).
	idle, payload, write time.Duration
	maxHead, maxStreams  int
	// linger is how long a burst waits for a connection's next frame
	// before handing it back to the poller (muxConn.burst).
	linger time.Duration

	// frames are answer frames' buffers, reused once written: every
	// heartbeat is answered with one.
	frames sync.Pool
	// workers serve the requests.
	workers *streamWorkers

	mu     sync.Mutex
	conns  map[*muxConn]struct{}
	closed bool
}

// maxPooledFrame bounds the answer buffers muxServer.frames keeps: a
// large answer (a batch of tasks) does not pin its buffer.
const maxPooledFrame = 16 << 10

// newMuxServer serves h; poll (the platform's muxPoller) reads the idle
// connections, or without it a reader goroutine each.
func newMuxServer(h http.Handler, cfg Config, log *slog.Logger, poll bool) *muxServer {
	s := &muxServer{handler: h, log: log, idle: cfg.IdleTimeout, payload: cfg.ReadHeaderTimeout + cfg.BodyReadTimeout,
		write: cfg.ReadHeaderTimeout + cfg.BodyReadTimeout, maxHead: cfg.MaxHeaderBytes, maxStreams: muxMaxStreams,
		linger: muxLinger, conns: map[*muxConn]struct{}{}, workers: newStreamWorkers(0)}
	if poll {
		p, err := newMuxPoller()
		if err != nil {
			log.Info("node listener: framed connections each get a reader goroutine", "reason", err)
		}
		s.poll = p
	}
	return s
}

// muxMaxStreams is a connection's requests in flight; HTTP/2's
// net/http default is 250, an agent uses fewer than 16.
const muxMaxStreams = 64

// muxLinger is how long a connection in the poller keeps its reading
// goroutine after a frame that came within as long of the one before: an
// agent that sends that often (a fleet under load) is read as by a
// goroutine of its own, and one at the default 5-second heartbeat holds
// none between its requests (docs/performance.md, "Idle agents without
// goroutines").
const muxLinger = time.Second

// serve serves c, whose handshake is done, until it closes; it runs on a
// goroutine of its own (started by the node listener), which returns
// once the connection waits in the poller, or else reads until the
// connection closes. gc is c's transport.
func (s *muxServer) serve(c *tls.Conn, gc *gatedConn) {
	state := c.ConnectionState()
	ctx, cancel := context.WithCancel(context.Background())
	mc := &muxConn{s: s, nc: c, gc: gc, tls: &state, ctx: ctx, cancel: cancel, remote: c.RemoteAddr().String(),
		host: state.ServerName, streams: map[uint32]*muxStream{}}
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
	if mc.polled() {
		mc.burst(false) // what came with the handshake, then the poller
		return
	}
	mc.fail(mc.readLoop())
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
	if s.poll != nil {
		s.poll.close()
	}
	s.workers.close()
}

// muxConn is one framed connection.
type muxConn struct {
	s      *muxServer
	nc     *tls.Conn
	gc     *gatedConn
	tls    *tls.ConnectionState // shared, read-only, by every request
	ctx    context.Context      // ends when the connection closes
	cancel context.CancelFunc
	remote string
	host   string
	wmu    sync.Mutex // one answer at a time
	closer sync.Once

	mu sync.Mutex
	// In the poller (reg set, under mu): its registration, and the idle
	// timer that stands in for the reader's idle deadline.
	reg   *pollReg
	idleT *time.Timer
	// lastFrame is when the reading goroutine last read a frame (one
	// reads at a time): a burst lingers only for a busy connection.
	lastFrame time.Time
	streams   map[uint32]*muxStream // requests in flight
	midFrame  bool                  // the reader is reading a payload, under its deadline
	reading   bool                  // a burst is reading (in the poller)
}

// close closes the connection, once: its requests are given up (their
// contexts end, their parks are cancelled), and the server and the poller
// forget it.
func (c *muxConn) close() {
	c.closer.Do(func() {
		c.mu.Lock()
		c.cancel() // under mu: no stream starts after it (start)
		streams := make([]*muxStream, 0, len(c.streams))
		for _, st := range c.streams {
			streams = append(streams, st)
		}
		if c.idleT != nil {
			c.idleT.Stop()
		}
		c.mu.Unlock()
		for _, st := range streams {
			st.giveUp()
		}
		_ = c.nc.Close()
		if c.s.poll != nil {
			c.s.poll.remove(c)
		}
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
}

// fail closes the connection after its reader's err (logged unless the
// agent or the server closed it).
func (c *muxConn) fail(err error) {
	c.close()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		c.s.log.Debug("node listener: framed connection closed", "remote", c.remote, "err", err)
	}
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
		st, err := c.handle(f)
		if err != nil {
			return err
		}
		if st != nil {
			c.s.workers.serve(st)
		}
		c.armIdle()
	}
}

// handle takes a frame from the agent: a request's stream, to serve, or a
// cancel (nil stream).
func (c *muxConn) handle(f nodemux.Frame) (*muxStream, error) {
	switch f.Type {
	case nodemux.TypeRequest:
		return c.start(f)
	case nodemux.TypeCancel:
		c.mu.Lock()
		st := c.streams[f.Stream]
		c.mu.Unlock()
		if st != nil {
			st.giveUp()
		}
		return nil, nil
	}
	return nil, fmt.Errorf("%w: frame type %d from the agent", nodemux.ErrProtocol, f.Type)
}

// armIdle starts the idle timeout when nothing is in flight and nothing
// is being read (the connection then waits for the next request, or for
// the agent to go away): the reader's read deadline, or in the poller the
// idle timer.
func (c *muxConn) armIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.streams) > 0 || c.s.idle <= 0 || c.midFrame {
		return
	}
	switch {
	case c.reg == nil:
		_ = c.nc.SetReadDeadline(time.Now().Add(c.s.idle))
	case c.reading: // the burst arms it when it ends
	case c.idleT == nil:
		c.idleT = time.AfterFunc(c.s.idle, c.idleClose)
	default:
		c.idleT.Reset(c.s.idle)
	}
}

// start takes a request frame: its stream, to serve.
func (c *muxConn) start(f nodemux.Frame) (*muxStream, error) {
	req, err := nodemux.ParseRequest(f.Payload)
	if err != nil {
		return nil, err
	}
	h := c.s.handler
	if headLen := len(f.Payload) - len(req.Body); c.s.maxHead > 0 && headLen > c.s.maxHead {
		h = c.s.refusal(httpapi.Errorf(http.StatusRequestHeaderFieldsTooLarge, "header_too_large",
			"request method, target and header fields of %d bytes (at most %d)", headLen, c.s.maxHead))
	}
	c.mu.Lock()
	if c.ctx.Err() != nil {
		c.mu.Unlock()
		return nil, net.ErrClosed
	}
	if _, dup := c.streams[f.Stream]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: stream %d already in flight", nodemux.ErrProtocol, f.Stream)
	}
	if len(c.streams) >= 2*c.s.maxStreams { // refusals pile up too: an agent that does not read them
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %d requests in flight", nodemux.ErrProtocol, len(c.streams))
	}
	if len(c.streams) >= c.s.maxStreams {
		h = c.s.refusal(&httpapi.Error{Status: http.StatusTooManyRequests, RetryAfter: 1,
			CodedError: api.CodedError{Code: "node_mux_stream_limit",
				Message: fmt.Sprintf("more than %d requests in flight on one connection", c.s.maxStreams)}})
	}
	// Not a child of the connection's context: close gives the streams up
	// from the map (a child would cost the connection's context a map of
	// its streams too).
	st := &muxStream{c: c, id: f.Stream, req: req, h: h}
	st.ctx, st.cancel = context.WithCancel(context.Background())
	st.w.st = st
	c.streams[f.Stream] = st
	if c.reg == nil {
		_ = c.nc.SetReadDeadline(time.Time{}) // in flight: no idle deadline
	}
	c.mu.Unlock()
	return st, nil
}

// refusal is a handler that answers err (with a correlation id, as the
// node API's own refusals).
func (s *muxServer) refusal(err error) http.Handler {
	return httpapi.WithCorrelation(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(s.log, w, r, err)
	}))
}

// muxStream is one request in flight. A handler that parks it
// (muxWriter.Park) returns, and the park finishes it later; a handler that
// blocks (a long-poll that cannot park) keeps its goroutine in the
// handler, so the frames below the handler are kept small (serve): the GC
// halves a parked goroutine's 8 KiB stack only while its frames use under
// ≈ 1.2 KB (docs/performance.md, "Memory per idle long-poll").
type muxStream struct {
	c      *muxConn
	ctx    context.Context
	cancel context.CancelFunc
	id     uint32
	req    nodemux.Request
	h      http.Handler
	w      muxWriter
	park   *httpapi.Park // set by the handler's goroutine (under c.mu), before it returns
	done   atomic.Bool   // finished: its answer is sent or dropped
}

// giveUp ends a stream the agent cancelled or whose connection closed:
// its context ends, and a parked request is cancelled (Park.Cancel).
func (st *muxStream) giveUp() {
	st.c.mu.Lock()
	st.cancel()
	p := st.park
	st.c.mu.Unlock()
	if p != nil {
		p.Cancel()
	}
}

func (st *muxStream) serve() {
	defer st.end()
	st.w.header = http.Header{}
	r := st.request()
	if r == nil {
		st.w.aborted = true
		return
	}
	st.h.ServeHTTP(&st.w, r)
}

// end is deferred by serve: it recovers a handler's panic (aborting the
// stream; logged unless it is http.ErrAbortHandler) and finishes the
// stream.
//
//go:noinline
func (st *muxStream) end() {
	if p := recover(); p != nil {
		st.abort(p)
		return
	}
	if st.park != nil { // its Finish answers (maybe already has)
		st.park.Returned()
		return
	}
	st.finish()
}

// abort ends a stream whose handler (or the function a park resumed)
// panicked: logged unless http.ErrAbortHandler, and the connection closes.
func (st *muxStream) abort(p any) {
	st.w.aborted = true
	if p != http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
		st.c.s.log.Error("node API handler panicked", "remote", st.c.remote, "request", st.req.Method+" "+st.req.Target,
			"panic", p)
	}
	st.finish()
}

// finish sends the stream's answer, once.
func (st *muxStream) finish() {
	if st.done.CompareAndSwap(false, true) {
		st.c.finish(st)
	}
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
	// The correlation id goes in now: WithCorrelation then has no request to copy.
	ctx := httpapi.Correlated(st.ctx, st.req.Header, st.w.header)
	r, err := http.NewRequestWithContext(ctx, st.req.Method, "https://"+c.host+st.req.Target, body)
	if err != nil {
		c.s.log.Debug("node listener: framed request target", "remote", c.remote, "err", err)
		return nil
	}
	r.Header, r.RequestURI, r.RemoteAddr, r.TLS = st.req.Header, st.req.Target, c.remote, c.tls
	r.Proto, r.ProtoMajor, r.ProtoMinor = nodemux.Proto, 1, 0
	st.req.Header, st.req.Body = nil, nil // the request holds them; method and target stay for abort's log
	return r
}

// finish sends a request's answer (unless the agent cancelled it) and ends
// its stream. A handler that panicked closes the connection, as net/http
// resets its stream: the agent's request fails instead of waiting.
func (c *muxConn) finish(st *muxStream) {
	c.mu.Lock()
	if c.streams[st.id] == st {
		delete(c.streams, st.id)
	}
	c.mu.Unlock()
	cancelled := st.ctx.Err() != nil
	st.cancel()
	if st.w.aborted {
		c.close()
		return
	}
	if !cancelled {
		c.answer(st.id, &st.w)
	}
	c.armIdle()
}

// answer writes w as stream's answer frame; a write that fails or does
// not finish in time closes the connection.
func (c *muxConn) answer(stream uint32, w *muxWriter) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	buf, _ := c.s.frames.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	frame := nodemux.AppendResponse((*buf)[:0], stream, w.status, w.header, w.body.Bytes())
	defer func() {
		if cap(frame) <= maxPooledFrame {
			*buf = frame
			c.s.frames.Put(buf)
		}
	}()
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
// when the handler returns, or when its park finishes.
type muxWriter struct {
	st      *muxStream
	header  http.Header
	status  int
	body    bytes.Buffer
	aborted bool
}

// Park keeps the request open after its handler returns (httpapi.Parker):
// a parked long-poll costs no goroutine while it waits.
func (w *muxWriter) Park() *httpapi.Park {
	st := w.st
	p := httpapi.NewPark(st.finish, st.abort)
	st.c.mu.Lock()
	st.park = p
	gone := st.ctx.Err() != nil // given up before it parked
	st.c.mu.Unlock()
	if gone {
		p.Cancel()
	}
	return p
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
