package server

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/nodemux"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/terminal/terminaltest"
)

// nodeTLSPair is a CA, a node listener TLS config (client certificates
// verified if given, as keys.NodeTLSConfig) and a client certificate of
// node id.
func nodeTLSPair(t *testing.T, id string) (*pki.CA, *tls.Config, tls.Certificate) {
	t.Helper()
	p := terminaltest.NewPKI(t, "test CA", id)
	return p.CA, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.Server},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: p.CA.Pool()}, p.Node
}

// serveHandshakeListener serves h the way Serve serves the node API and
// returns the listener's address.
func serveHandshakeListener(t *testing.T, cfg *tls.Config, timeout time.Duration, h http.Handler) string {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: nodeListenerTLS(cfg), ReadHeaderTimeout: 10 * time.Second}
	ln := newHandshakeListener(raw, nodeListenerTLS(cfg), timeout, slog.New(slog.DiscardHandler), nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v, want ErrServerClosed", err)
		}
	})
	return raw.Addr().String()
}

// TestHandshakeListener: connections whose handshake the listener did are
// served over HTTP/2 with the client certificate on the request; a failed
// or stalled handshake closes that connection only.
func TestHandshakeListener(t *testing.T) {
	ca, cfg, client := nodeTLSPair(t, "node-a")
	addr := serveHandshakeListener(t, cfg, 200*time.Millisecond, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := "none"
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			id, _ = pki.NodeID(r.TLS.PeerCertificates[0])
		}
		_, _ = io.WriteString(w, r.Proto+" "+id)
	}))
	tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13,
		RootCAs: ca.Pool(), Certificates: []tls.Certificate{client}}}
	defer tr.CloseIdleConnections()
	get := func() string {
		t.Helper()
		resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := get(); got != "HTTP/2.0 node-a" {
		t.Fatalf("response %q, want HTTP/2.0 over the handshaken connection with the node's certificate", got)
	}

	// Not TLS at all: the handshake fails and only that connection closes.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	expectClosed(t, c)
	// Silent: the handshake's deadline closes it.
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	expectClosed(t, c)

	tr.CloseIdleConnections() // a fresh connection, so a fresh handshake
	if got := get(); got != "HTTP/2.0 node-a" {
		t.Fatalf("after failed handshakes: response %q", got)
	}
}

// expectClosed reads from c until the server closes (or resets) it.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang fails the test instead of blocking it
	// EOF (nil) or a reset: closed either way.
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("connection not closed by the server: %v", err)
	}
}

// TestHandshakeListenerClose: Close ends a pending Accept.
func TestHandshakeListenerClose(t *testing.T) {
	_, cfg, _ := nodeTLSPair(t, "node-a")
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newHandshakeListener(raw, nodeListenerTLS(cfg), time.Second, slog.New(slog.DiscardHandler), nil)
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if c != nil {
			c.Close()
		}
		errc <- err
	}()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if err := ln.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v, want net.ErrClosed", err)
	}
}

// TestNodeListenerTLS: the listener's config offers the framed protocol
// first, then h2, and the caller's config is not modified.
func TestNodeListenerTLS(t *testing.T) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	got := nodeListenerTLS(cfg)
	if !slices.Equal(got.NextProtos, []string{nodemux.Proto, "h2", "http/1.1"}) {
		t.Fatalf("NextProtos %q, want [%s h2 http/1.1]", got.NextProtos, nodemux.Proto)
	}
	if len(cfg.NextProtos) != 0 {
		t.Fatalf("caller's config modified: %q", cfg.NextProtos)
	}
}

// TestHandshakeGate: handshakes compute a bounded number at a time, but a
// client that stalls mid-handshake holds no slot: with more stalled
// clients than slots, other agents still connect at once, and every slot
// is free again afterwards.
func TestHandshakeGate(t *testing.T) {
	ca, cfg, client := nodeTLSPair(t, "node-a")
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newHandshakeListener(raw, nodeListenerTLS(cfg), time.Minute, slog.New(slog.DiscardHandler), nil)
	srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		TLSConfig: nodeListenerTLS(cfg), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := raw.Addr().String()

	// Stalled clients, three times as many as there are slots: some send
	// nothing, some half a ClientHello.
	for i := range 3 * cap(ln.cpu) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if i%2 == 1 {
			_, _ = c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}) // a record header and one byte
		}
	}
	time.Sleep(100 * time.Millisecond)

	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13,
				RootCAs: ca.Pool(), Certificates: []tls.Certificate{client}}}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Get("https://" + addr + "/")
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("agent behind stalled handshakes: %v", err)
	}
	if n := len(ln.cpu); n != 0 {
		t.Errorf("%d handshake slots still held with only stalled clients left", n)
	}
}
