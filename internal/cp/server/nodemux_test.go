package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodemux"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// readers is how a test's framed connections are read: by the poller
// (linger: how long a burst waits for the next frame) or by a reader
// goroutine each.
type readers struct {
	poll   bool
	linger time.Duration
}

// eachReader runs test with the framed connections read by the poller
// (on linux), with and without a linger, and by a reader goroutine each.
func eachReader(t *testing.T, test func(t *testing.T, rd readers)) {
	for _, tc := range []struct {
		name string
		rd   readers
	}{
		{"poller", readers{poll: true, linger: 50 * time.Millisecond}},
		{"poller without linger", readers{poll: true}},
		{"reader", readers{}},
	} {
		t.Run(tc.name, func(t *testing.T) { test(t, tc.rd) })
	}
}

// muxFixture is a node listener (handshakeListener) whose framed
// connections go to ms and the others to an HTTP/2 server of the same
// handler.
type muxFixture struct {
	addr   string
	ms     *muxServer
	client *tls.Config // offers nodemux.Proto first, with the node's certificate
}

func newMuxFixture(t *testing.T, h http.Handler, cfg Config, withMux bool, rd readers) *muxFixture {
	t.Helper()
	ca, tcfg, cert := nodeTLSPair(t, "node-a")
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ms := newMuxServer(h, cfg, slog.New(slog.DiscardHandler), rd.poll)
	if rd.poll && runtime.GOOS == "linux" && ms.poll == nil {
		t.Fatal("no poller on linux")
	}
	ms.linger = rd.linger
	lcfg := nodeListenerTLS(tcfg)
	if !withMux { // a control plane that predates the framing
		lcfg.NextProtos = []string{"h2", "http/1.1"}
	}
	srv := &http.Server{Handler: h, TLSConfig: lcfg}
	ln := newHandshakeListener(raw, lcfg, 5*time.Second, slog.New(slog.DiscardHandler), nil)
	if withMux {
		ln.mux = ms.serve
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { ms.Close(); _ = srv.Close() })
	return &muxFixture{addr: raw.Addr().String(), ms: ms, client: &tls.Config{MinVersion: tls.VersionTLS13,
		RootCAs: ca.Pool(), Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1",
		NextProtos: []string{nodemux.Proto, "h2", "http/1.1"}}}
}

func (f *muxFixture) dial(ctx context.Context) (net.Conn, string, error) {
	c, err := (&tls.Dialer{Config: f.client}).DialContext(ctx, "tcp", f.addr)
	if err != nil {
		return nil, "", err
	}
	return c, c.(*tls.Conn).ConnectionState().NegotiatedProtocol, nil
}

// transport is the agent's kind of transport, falling back to HTTP/2;
// dials counts its framed dials.
func (f *muxFixture) transport(dials *atomic.Int32) *nodemux.Transport {
	fb := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: f.client.Clone()}
	fb.TLSClientConfig.NextProtos = nil
	return &nodemux.Transport{Fallback: fb, Dial: func(ctx context.Context) (net.Conn, string, error) {
		if dials != nil {
			dials.Add(1)
		}
		return f.dial(ctx)
	}}
}

func (f *muxFixture) url(path string) string { return "https://" + f.addr + path }

func muxDefaults() Config {
	return Config{ReadHeaderTimeout: 5 * time.Second, BodyReadTimeout: 5 * time.Second, MaxHeaderBytes: 64 << 10}
}

// echo answers what the request carried.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	id := "none"
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		id, _ = pki.NodeID(r.TLS.PeerCertificates[0])
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Echo", r.Header.Get("X-Test"))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "%s %s %s %s %s %s", r.Proto, id, r.Method, r.URL.Path, r.URL.RawQuery, body)
})

func do(t *testing.T, rt http.RoundTripper, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestMuxRoundTrip: a request over the framed connection reaches the
// handler with its method, target, fields, body and the node's
// certificate, and its answer comes back whole; every request of the
// agent shares one connection. Against a listener without the framing the
// transport falls back to HTTP/2.
func TestMuxRoundTrip(t *testing.T) { eachReader(t, testMuxRoundTrip) }

func testMuxRoundTrip(t *testing.T, rd readers) {
	for _, withMux := range []bool{true, false} {
		f := newMuxFixture(t, echo, muxDefaults(), withMux, rd)
		var dials atomic.Int32
		tr := f.transport(&dials)
		want := nodemux.Proto
		if !withMux {
			want = "HTTP/2.0"
		}
		for i := range 3 {
			req, _ := http.NewRequest(http.MethodPost, f.url("/internal/v1/x?timeout=1s"), strings.NewReader(fmt.Sprint("body", i)))
			req.Header.Set("X-Test", "v")
			resp, body := do(t, tr, req)
			if resp.StatusCode != http.StatusCreated || resp.Header.Get("X-Echo") != "v" ||
				body != fmt.Sprintf("%s node-a POST /internal/v1/x timeout=1s body%d", want, i) {
				t.Fatalf("mux %v: %d %v %q", withMux, resp.StatusCode, resp.Header, body)
			}
		}
		if n := dials.Load(); n != 1 {
			t.Fatalf("mux %v: %d framed dials for 3 requests, want 1", withMux, n)
		}
	}
}

// TestMuxCancel: a request the agent stops waiting for ends its handler's
// context (as a reset HTTP/2 stream does), and the connection goes on.
func TestMuxCancel(t *testing.T) { eachReader(t, testMuxCancel) }

func testMuxCancel(t *testing.T, rd readers) {
	ended := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/park" {
			<-r.Context().Done()
			ended <- struct{}{}
			return
		}
		echo(w, r)
	})
	f := newMuxFixture(t, h, muxDefaults(), true, rd)
	tr := f.transport(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.url("/park"), nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("parked request: %v, want its deadline", err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context did not end after the agent cancelled")
	}
	req, _ = http.NewRequest(http.MethodGet, f.url("/next"), nil)
	if resp, _ := do(t, tr, req); resp.StatusCode != http.StatusCreated {
		t.Fatalf("after a cancel: %d", resp.StatusCode)
	}
}

// TestMuxStreamLimit: beyond maxStreams requests in flight on one
// connection the answer is 429 node_mux_stream_limit, with a correlation
// id; the requests in flight finish.
func TestMuxStreamLimit(t *testing.T) { eachReader(t, testMuxStreamLimit) }

func testMuxStreamLimit(t *testing.T, rd readers) {
	release := make(chan struct{})
	var parked atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parked.Add(1)
		<-release
		w.WriteHeader(http.StatusNoContent)
	})
	f := newMuxFixture(t, h, muxDefaults(), true, rd)
	f.ms.maxStreams = 2
	tr := f.transport(nil)
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequest(http.MethodGet, f.url("/park"), nil)
			resp, err := tr.RoundTrip(req)
			if err == nil && resp.StatusCode != http.StatusNoContent {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			errc <- err
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); parked.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("requests did not park")
		}
	}
	req, _ := http.NewRequest(http.MethodGet, f.url("/third"), nil)
	resp, body := do(t, tr, req)
	var eb api.ErrorBody
	_ = json.Unmarshal([]byte(body), &eb)
	if resp.StatusCode != http.StatusTooManyRequests || eb.Error.Code != "node_mux_stream_limit" ||
		eb.Error.CorrelationID == "" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third request: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	close(release)
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// TestMuxHeaderLimit: a request whose method, target and fields exceed
// MaxHeaderBytes is answered 431, as net/http answers it.
func TestMuxHeaderLimit(t *testing.T) { eachReader(t, testMuxHeaderLimit) }

func testMuxHeaderLimit(t *testing.T, rd readers) {
	cfg := muxDefaults()
	cfg.MaxHeaderBytes = 200
	f := newMuxFixture(t, echo, cfg, true, rd)
	req, _ := http.NewRequest(http.MethodGet, f.url("/x"), nil)
	req.Header.Set("X-Big", strings.Repeat("a", 300))
	if resp, body := do(t, f.transport(nil), req); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge ||
		!strings.Contains(body, "header_too_large") {
		t.Fatalf("big header: %d %s", resp.StatusCode, body)
	}
}

// TestMuxBrokenFraming: a frame that breaks the framing closes the
// connection; a handler that panics closes it too (the agent's request
// fails instead of waiting).
func TestMuxBrokenFraming(t *testing.T) { eachReader(t, testMuxBrokenFraming) }

func testMuxBrokenFraming(t *testing.T, rd readers) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("handler bug")
		}
		<-r.Context().Done()
	})
	f := newMuxFixture(t, h, muxDefaults(), true, rd)
	request := func(stream uint32, method, target string) []byte {
		return nodemux.AppendRequest(nil, stream, method, target, nil, nil)
	}
	for name, frames := range map[string][]byte{
		"unknown type":    nodemux.AppendHeader(nil, 9, 1, 0),
		"answer frame":    nodemux.AppendResponse(nil, 1, 200, nil, nil),
		"over MaxPayload": nodemux.AppendHeader(nil, nodemux.TypeRequest, 1, nodemux.MaxPayload+1),
		"bad method":      request(1, "GET X", "/x"),
		"bad target":      request(1, "GET", "http://elsewhere/x"),
		"target with CR":  request(1, "GET", "/x\r\nHost: y"),
		"field count":     append(append(nodemux.AppendHeader(nil, nodemux.TypeRequest, 1, 7), 3, 'G', 'E', 'T', 1, '/'), 200),
		"duplicate":       append(request(1, "GET", "/park"), request(1, "GET", "/park")...),
		"panic":           request(1, "GET", "/panic"),
	} {
		t.Run(name, func(t *testing.T) {
			c, proto, err := f.dial(t.Context())
			if err != nil || proto != nodemux.Proto {
				t.Fatalf("dial: %q %v", proto, err)
			}
			defer c.Close()
			if _, err := c.Write(frames); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(make([]byte, 64))
			var ne net.Error
			if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
				t.Fatalf("connection still open (read %d, %v)", n, err)
			}
		})
	}
}

// TestMuxIdle: a connection with nothing in flight closes after the idle
// timeout; one with a request in flight does not.
func TestMuxIdle(t *testing.T) { eachReader(t, testMuxIdle) }

func testMuxIdle(t *testing.T, rd readers) {
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/park" {
			<-release
		}
	})
	cfg := muxDefaults()
	cfg.IdleTimeout = 300 * time.Millisecond
	f := newMuxFixture(t, h, cfg, true, rd)
	tr := f.transport(nil)
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, f.url("/park"), nil)
		_, err := tr.RoundTrip(req)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("request in flight ended after the idle timeout: %v", err)
	case <-time.After(time.Second):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Now idle: the next request after the timeout redials (the first
	// connection was closed by the server).
	c, _, err := f.dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("idle connection: %v after %s, want closed after 300ms", err, time.Since(start))
	}
}

// TestMuxClose: closing the server ends the handlers' contexts and the
// agents' requests in flight fail with nodemux.ErrConnClosed.
func TestMuxClose(t *testing.T) { eachReader(t, testMuxClose) }

func testMuxClose(t *testing.T, rd readers) {
	parked := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(parked)
		<-r.Context().Done()
	})
	f := newMuxFixture(t, h, muxDefaults(), true, rd)
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, f.url("/park"), nil)
		_, err := f.transport(nil).RoundTrip(req)
		done <- err
	}()
	<-parked
	f.ms.Close()
	select {
	case err := <-done:
		if !errors.Is(err, nodemux.ErrConnClosed) {
			t.Fatalf("request in flight: %v, want ErrConnClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("request in flight did not end")
	}
}

// TestMuxRefusalsBounded: an agent that sends requests beyond the stream
// limit and never reads their 429s cannot pile up refusals: past twice the
// limit in flight the connection is closed (long before the write timeout
// would close it).
func TestMuxRefusalsBounded(t *testing.T) { eachReader(t, testMuxRefusalsBounded) }

func testMuxRefusalsBounded(t *testing.T, rd readers) {
	release := make(chan struct{})
	defer close(release)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release })
	cfg := muxDefaults()
	cfg.ReadHeaderTimeout, cfg.BodyReadTimeout = time.Minute, time.Minute
	f := newMuxFixture(t, h, cfg, true, rd)
	f.ms.maxStreams = 2
	c, _, err := f.dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	closed := make(chan error, 1)
	go func() {
		var b []byte
		for i := uint32(1); ; i++ {
			b = nodemux.AppendRequest(b, i, "GET", "/x", http.Header{"X-Pad": {strings.Repeat("p", 64)}}, nil)
			if len(b) > 16<<10 {
				if _, err := c.Write(b); err != nil {
					closed <- err
					return
				}
				b = b[:0]
			}
		}
	}()
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		t.Fatal("connection that does not read its refusals still open")
	}
}

// TestMuxAnswerTooLarge: an answer over what a frame carries is a 500
// response_too_large with the request's correlation id, not a closed
// connection.
func TestMuxAnswerTooLarge(t *testing.T) { eachReader(t, testMuxAnswerTooLarge) }

func testMuxAnswerTooLarge(t *testing.T, rd readers) {
	h := httpapi.WithCorrelation(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(make([]byte, nodemux.MaxPayload+1))
	}))
	f := newMuxFixture(t, h, muxDefaults(), true, rd)
	req, _ := http.NewRequest(http.MethodGet, f.url("/big"), nil)
	req.Header.Set(api.HeaderCorrelationID, "cid-big")
	resp, body := do(t, f.transport(nil), req)
	var eb api.ErrorBody
	_ = json.Unmarshal([]byte(body), &eb)
	if resp.StatusCode != http.StatusInternalServerError || eb.Error.Code != "response_too_large" || eb.Error.CorrelationID != "cid-big" {
		t.Fatalf("too large: %d %s", resp.StatusCode, body)
	}
}
