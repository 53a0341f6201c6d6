package nodemux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"
)

// DialFunc opens a connection to the control plane whose TLS handshake is
// done, offering Proto in ALPN, and returns the protocol the server chose.
type DialFunc func(ctx context.Context) (conn net.Conn, proto string, err error)

// Transport is an http.RoundTripper that carries requests as frames over
// one connection (dialled on demand by Dial, one dial at a time; requests
// made meanwhile wait for it). It sends to Fallback, an ordinary HTTP/2
// transport, a request the framing cannot carry (an Upgrade, a body over
// MaxPayload/2) and, for FallbackFor after a dial found a server that did
// not choose Proto (one that predates it), every request.
type Transport struct {
	Dial     DialFunc
	Fallback http.RoundTripper
	// WriteTimeout bounds writing one frame (default 30 s); a connection
	// whose frame does not go out in time is closed.
	WriteTimeout time.Duration
	// FallbackFor is how long requests go to Fallback after a server did
	// not choose Proto (default 10 minutes).
	FallbackFor time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Adopt, when set, takes a connection whose server chose another
	// protocol, so that Fallback's next dial can use it instead of a second
	// handshake; without it such a connection is closed.
	Adopt func(net.Conn)

	mu            sync.Mutex
	conn          *conn
	dialing       chan struct{} // closed when the dial in progress ends; nil when none is
	fallbackUntil time.Time
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Upgrade") != "" || t.fallingBack() {
		return t.Fallback.RoundTrip(req)
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		b, err := io.ReadAll(io.LimitReader(req.Body, MaxPayload/2+1))
		if err != nil {
			req.Body.Close()
			return nil, fmt.Errorf("nodemux: read request body: %w", err)
		}
		if len(b) > MaxPayload/2 { // too large to frame: the rest goes by HTTP/2
			r2 := req.Clone(req.Context())
			r2.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(b), req.Body), req.Body}
			return t.Fallback.RoundTrip(r2)
		}
		req.Body.Close()
		body = b
	}
	for attempt := 0; ; attempt++ {
		c, err := t.get(req.Context())
		if err != nil {
			return nil, err
		}
		if c == nil { // the server does not speak Proto
			r2 := req.Clone(req.Context())
			if body != nil {
				r2.Body = io.NopCloser(bytes.NewReader(body))
			}
			return t.Fallback.RoundTrip(r2)
		}
		resp, err := c.roundTrip(req, body)
		// A connection found closed before the request was sent (the
		// server went away between requests): nothing of it reached the
		// server, so it goes once more, on a new connection.
		if errors.Is(err, errNotSent) && attempt == 0 {
			continue
		}
		return resp, err
	}
}

// errNotSent marks a request that found its connection already closed.
var errNotSent = errors.New("not sent")

// CloseIdleConnections drains the framed connection: requests in flight
// finish on it, the next request dials a new one (the agent calls this
// after renewing its certificate). It closes Fallback's idle connections
// too.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	c := t.conn
	t.conn = nil
	t.mu.Unlock()
	if c != nil {
		c.drain()
	}
	if ci, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

func (t *Transport) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

func (t *Transport) fallingBack() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.now().Before(t.fallbackUntil)
}

// get returns the open connection or dials one (nil, nil: the server
// chose another protocol; the caller falls back).
func (t *Transport) get(ctx context.Context) (*conn, error) {
	for {
		t.mu.Lock()
		if t.conn != nil {
			c := t.conn
			t.mu.Unlock()
			return c, nil
		}
		if t.now().Before(t.fallbackUntil) {
			t.mu.Unlock()
			return nil, nil
		}
		if t.dialing == nil {
			ch := make(chan struct{})
			t.dialing = ch
			t.mu.Unlock()
			c, err := t.dial(ctx)
			t.mu.Lock()
			t.dialing = nil
			close(ch)
			t.mu.Unlock()
			return c, err
		}
		ch := t.dialing
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (t *Transport) dial(ctx context.Context) (*conn, error) {
	nc, proto, err := t.Dial(ctx)
	if err != nil {
		return nil, err
	}
	if proto != Proto {
		if t.Adopt != nil {
			t.Adopt(nc)
		} else {
			nc.Close()
		}
		fallback := t.FallbackFor
		if fallback <= 0 {
			fallback = 10 * time.Minute
		}
		t.mu.Lock()
		t.fallbackUntil = t.now().Add(fallback)
		t.mu.Unlock()
		return nil, nil
	}
	wt := t.WriteTimeout
	if wt <= 0 {
		wt = 30 * time.Second
	}
	c := &conn{t: t, nc: nc, writeTimeout: wt, next: 1, pending: map[uint32]chan result{}}
	t.mu.Lock()
	t.conn = c
	t.mu.Unlock()
	go c.readLoop()
	return c, nil
}

// ErrConnClosed is the error of a request whose connection closed before
// its answer came.
var ErrConnClosed = errors.New("nodemux: connection closed")

type result struct {
	resp Response
	err  error
}

// conn is one framed connection and its requests in flight.
type conn struct {
	t            *Transport
	nc           net.Conn
	writeTimeout time.Duration
	wmu          sync.Mutex // one frame at a time

	mu       sync.Mutex
	next     uint32
	pending  map[uint32]chan result
	err      error // why it closed; nil while open
	draining bool  // close once nothing is pending
}

func (c *conn) roundTrip(req *http.Request, body []byte) (*http.Response, error) {
	ctx := req.Context()
	ch := make(chan result, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.t.drop(c)
		return nil, fmt.Errorf("%w (%w)", err, errNotSent)
	}
	id := c.next
	c.next++
	c.pending[id] = ch
	c.mu.Unlock()
	frame := AppendRequest(make([]byte, 0, HeaderLen+64+len(req.URL.Path)+len(body)), id, req.Method,
		req.URL.RequestURI(), req.Header, body)
	trace := httptrace.ContextClientTrace(ctx)
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: c.nc, Reused: id > 1})
	}
	err := c.write(frame)
	if trace != nil && trace.WroteRequest != nil {
		trace.WroteRequest(httptrace.WroteRequestInfo{Err: err})
	}
	if err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		return &http.Response{Status: fmt.Sprintf("%d %s", r.resp.Status, http.StatusText(r.resp.Status)),
			StatusCode: r.resp.Status, Proto: Proto, ProtoMajor: 1, Header: r.resp.Header,
			Body: io.NopCloser(bytes.NewReader(r.resp.Body)), ContentLength: int64(len(r.resp.Body)), Request: req}, nil
	case <-ctx.Done():
		if c.forget(id) {
			_ = c.write(AppendHeader(nil, TypeCancel, id, 0))
		}
		return nil, ctx.Err()
	}
}

// write sends one frame; a failed or late write closes the connection.
func (c *conn) write(frame []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	if _, err := c.nc.Write(frame); err != nil {
		err = fmt.Errorf("%w: %w", ErrConnClosed, err)
		c.fail(err)
		return err
	}
	return nil
}

// forget drops a request that no longer waits; false if its answer (or
// the connection's end) came first.
func (c *conn) forget(id uint32) bool {
	c.mu.Lock()
	_, ok := c.pending[id]
	delete(c.pending, id)
	closeNow := c.draining && len(c.pending) == 0
	c.mu.Unlock()
	if closeNow {
		c.fail(fmt.Errorf("%w: drained", ErrConnClosed))
	}
	return ok
}

func (c *conn) readLoop() {
	var hdr [HeaderLen]byte
	for {
		f, err := ReadFrame(c.nc, &hdr, MaxPayload)
		if err == nil && f.Type != TypeResponse {
			err = fmt.Errorf("%w: frame type %d from the server", ErrProtocol, f.Type)
		}
		var resp Response
		if err == nil {
			resp, err = ParseResponse(f.Payload)
		}
		if err != nil {
			c.fail(fmt.Errorf("%w: %w", ErrConnClosed, err))
			return
		}
		c.mu.Lock()
		ch, ok := c.pending[f.Stream]
		delete(c.pending, f.Stream)
		closeNow := c.draining && len(c.pending) == 0
		c.mu.Unlock()
		if ok {
			ch <- result{resp: resp}
		}
		if closeNow {
			c.fail(fmt.Errorf("%w: drained", ErrConnClosed))
			return
		}
	}
}

// drain closes the connection once nothing is in flight on it.
func (c *conn) drain() {
	c.mu.Lock()
	c.draining = true
	idle := len(c.pending) == 0
	c.mu.Unlock()
	if idle {
		c.fail(fmt.Errorf("%w: drained", ErrConnClosed))
	}
}

// fail closes the connection and ends every request in flight with err.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, ch := range pending {
		ch <- result{err: err}
	}
	_ = c.nc.Close()
	c.t.drop(c)
}

// drop forgets c if it is the open connection.
func (t *Transport) drop(c *conn) {
	t.mu.Lock()
	if t.conn == c {
		t.conn = nil
	}
	t.mu.Unlock()
}
