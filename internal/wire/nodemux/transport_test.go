package nodemux

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pipeServer answers framed requests on in-memory connections: "/park"
// waits until release is closed, anything else at once with the body's
// length. It counts the connections it was given.
type pipeServer struct {
	release chan struct{}
	conns   atomic.Int32
	mu      sync.Mutex
	last    net.Conn
}

func (s *pipeServer) dial(proto string) DialFunc {
	return func(context.Context) (net.Conn, string, error) {
		client, server := net.Pipe()
		s.conns.Add(1)
		s.mu.Lock()
		s.last = server
		s.mu.Unlock()
		go s.serve(server)
		return client, proto, nil
	}
}

func (s *pipeServer) serve(c net.Conn) {
	var wmu sync.Mutex
	var hdr [HeaderLen]byte
	for {
		f, err := ReadFrame(c, &hdr, MaxPayload)
		if err != nil {
			c.Close()
			return
		}
		if f.Type != TypeRequest {
			continue
		}
		r, _ := ParseRequest(f.Payload)
		go func() {
			if r.Target == "/park" {
				<-s.release
			}
			wmu.Lock()
			defer wmu.Unlock()
			_, _ = c.Write(AppendResponse(nil, f.Stream, 200, http.Header{"X-Len": {strings.Repeat("x", len(r.Body))}}, []byte(r.Target)))
		}()
	}
}

type countingRT struct{ n atomic.Int32 }

func (c *countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
	}
	return &http.Response{StatusCode: 299, Body: http.NoBody, Request: r}, nil
}

func get(t *testing.T, tr *Transport, path string, body string) (*http.Response, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(http.MethodPost, "https://cp"+path, rd)
	return tr.RoundTrip(req)
}

// TestTransportDrain: CloseIdleConnections lets the request in flight
// finish on its connection; the next request dials a new one.
func TestTransportDrain(t *testing.T) {
	s := &pipeServer{release: make(chan struct{})}
	tr := &Transport{Dial: s.dial(Proto), Fallback: &countingRT{}}
	done := make(chan error, 1)
	go func() {
		resp, err := get(t, tr, "/park", "")
		if err == nil && resp.StatusCode != 200 {
			err = errors.New(resp.Status)
		}
		done <- err
	}()
	for s.conns.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the request is on the wire
	tr.CloseIdleConnections()
	if resp, err := get(t, tr, "/now", ""); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after drain: %v %v", resp, err)
	}
	if n := s.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the drained one and a new one)", n)
	}
	close(s.release)
	if err := <-done; err != nil {
		t.Fatalf("request in flight on the drained connection: %v", err)
	}
}

// TestTransportConnLost: requests in flight when the connection breaks
// fail with ErrConnClosed; the next request dials again.
func TestTransportConnLost(t *testing.T) {
	s := &pipeServer{release: make(chan struct{})}
	tr := &Transport{Dial: s.dial(Proto), Fallback: &countingRT{}}
	done := make(chan error, 1)
	go func() { _, err := get(t, tr, "/park", ""); done <- err }()
	for s.conns.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	s.mu.Lock()
	s.last.Close()
	s.mu.Unlock()
	if err := <-done; !errors.Is(err, ErrConnClosed) {
		t.Fatalf("request in flight: %v, want ErrConnClosed", err)
	}
	if resp, err := get(t, tr, "/now", ""); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the loss: %v %v", resp, err)
	}
	if s.conns.Load() != 2 {
		t.Fatalf("%d connections, want a redial", s.conns.Load())
	}
}

// TestTransportFallback: a server that chose another protocol sends
// requests to Fallback for FallbackFor, then the framing is tried again;
// an Upgrade and a body too large to frame always go to Fallback.
func TestTransportFallback(t *testing.T) {
	now := time.Unix(1000, 0)
	s := &pipeServer{release: make(chan struct{})}
	fb := &countingRT{}
	proto := "h2"
	tr := &Transport{Fallback: fb, FallbackFor: time.Minute, Now: func() time.Time { return now },
		Dial: func(ctx context.Context) (net.Conn, string, error) { return s.dial(proto)(ctx) }}
	for range 3 {
		if resp, err := get(t, tr, "/x", "b"); err != nil || resp.StatusCode != 299 {
			t.Fatalf("old server: %v %v", resp, err)
		}
	}
	if s.conns.Load() != 1 || fb.n.Load() != 3 {
		t.Fatalf("%d framed dials, %d fallback requests; want 1 and 3", s.conns.Load(), fb.n.Load())
	}
	proto = Proto
	now = now.Add(61 * time.Second)
	if resp, err := get(t, tr, "/x", "body"); err != nil || resp.StatusCode != 200 || resp.Header.Get("X-Len") != "xxxx" {
		t.Fatalf("after FallbackFor: %v %v", resp, err)
	}
	big := strings.Repeat("z", MaxPayload/2+1)
	if resp, err := get(t, tr, "/x", big); err != nil || resp.StatusCode != 299 {
		t.Fatalf("big body: %v %v", resp, err)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://cp/stream", nil)
	req.Header.Set("Upgrade", "websocket")
	if resp, err := tr.RoundTrip(req); err != nil || resp.StatusCode != 299 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	if fb.n.Load() != 5 {
		t.Fatalf("%d fallback requests, want 5", fb.n.Load())
	}
}

// TestTransportOneDial: requests made while the first dials wait for its
// connection and share it.
func TestTransportOneDial(t *testing.T) {
	s := &pipeServer{release: make(chan struct{})}
	gate := make(chan struct{})
	tr := &Transport{Fallback: &countingRT{}, Dial: func(ctx context.Context) (net.Conn, string, error) {
		<-gate
		return s.dial(Proto)(ctx)
	}}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := get(t, tr, "/x", ""); err != nil || resp.StatusCode != 200 {
				t.Errorf("%v %v", resp, err)
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	close(gate)
	wg.Wait()
	if s.conns.Load() != 1 {
		t.Fatalf("%d dials for 8 concurrent requests, want 1", s.conns.Load())
	}
}

// TestTransportRetriesUnsent: a request that finds its connection closed
// before it was sent (the server went away between requests) goes on a new
// connection instead of failing.
func TestTransportRetriesUnsent(t *testing.T) {
	s := &pipeServer{release: make(chan struct{})}
	tr := &Transport{Dial: s.dial(Proto), Fallback: &countingRT{}}
	if resp, err := get(t, tr, "/a", ""); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first: %v %v", resp, err)
	}
	tr.mu.Lock()
	c := tr.conn
	tr.mu.Unlock()
	c.mu.Lock()
	c.err = ErrConnClosed // closed, but not yet dropped from the transport
	c.mu.Unlock()
	if resp, err := get(t, tr, "/b", ""); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the connection closed: %v %v", resp, err)
	}
	if s.conns.Load() != 2 {
		t.Fatalf("%d connections, want a new one", s.conns.Load())
	}
}
