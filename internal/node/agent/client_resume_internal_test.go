package agent

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/terminal/terminaltest"
)

// seen is what the test server saw of one request's connection.
type seen struct {
	resumed bool
	serial  string // of the client certificate; "" without one
	proto   string
}

// TestClientResumesOnlyWithItsCertificate: the node client resumes its TLS
// session on a new connection, but only a session issued to the client
// certificate it presents now. A session from enrolment (no certificate)
// or from before a renewal would carry the wrong certificate (a resumed
// TLS 1.3 session keeps the first handshake's), so neither is used.
func TestClientResumesOnlyWithItsCertificate(t *testing.T) {
	p := terminaltest.NewPKI(t, "test CA", "node-a")
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seen{resumed: r.TLS.DidResume, proto: r.Proto}
		if len(r.TLS.PeerCertificates) > 0 {
			s.serial = r.TLS.PeerCertificates[0].SerialNumber.String()
		}
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.Server},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: p.CA.Pool()}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	c, err := newClient(srv.URL, p.CA.Pool(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// call makes one request on a new connection and returns what the
	// server saw.
	call := func(step string) seen {
		t.Helper()
		c.closeIdle()
		resp, err := c.http.Get(srv.URL + "/x")
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		resp.Body.Close()
		mu.Lock()
		defer mu.Unlock()
		return got[len(got)-1]
	}
	serial := func(cert tls.Certificate) string {
		t.Helper()
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber.String()
	}

	// Enrolment: no certificate, and nothing to resume later.
	for i := range 2 {
		if s := call(fmt.Sprintf("enrolment %d", i)); s.resumed || s.serial != "" || s.proto != "HTTP/2.0" {
			t.Fatalf("enrolment connection %d: %+v, want a full HTTP/2 handshake without certificate", i, s)
		}
	}

	certA := p.Node
	c.setCertificate(certA)
	if s := call("first with A"); s.resumed || s.serial != serial(certA) {
		t.Fatalf("first connection with certificate A: %+v, want a full handshake presenting A", s)
	}
	if s := call("second with A"); !s.resumed || s.serial != serial(certA) {
		t.Fatalf("second connection with certificate A: %+v, want A's session resumed", s)
	}

	// Renewal: the next connection presents B in a full handshake, and
	// then resumes B's session, never A's.
	certB := newNodeCert(t, p, "node-a")
	c.setCertificate(certB)
	if s := call("first with B"); s.resumed || s.serial != serial(certB) {
		t.Fatalf("first connection after renewal: %+v, want a full handshake presenting B (%s), not A's session",
			s, serial(certB))
	}
	if s := call("second with B"); !s.resumed || s.serial != serial(certB) {
		t.Fatalf("second connection after renewal: %+v, want B's session resumed", s)
	}
}

// newNodeCert is another certificate of node id from p's CA.
func newNodeCert(t *testing.T, p *terminaltest.PKI, id string) tls.Certificate {
	t.Helper()
	key, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CSRFor(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, _, err := p.CA.SignNodeCSR(csr, id, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, key)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestClientDialsOnce: requests that start together on a client without a
// connection (the heartbeat and the long-polls after a control-plane
// restart) share one dial and one handshake instead of one each, over
// HTTP/2; against an HTTP/1.1-only server they dial their own, and a held
// long-poll never holds up a heartbeat.
func TestClientDialsOnce(t *testing.T) {
	for _, tc := range []struct {
		name       string
		http2      bool
		handshakes int32 // 0: any
	}{{"http2", true, 1}, {"http1", false, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			p := terminaltest.NewPKI(t, "test CA", "node-a")
			var hellos atomic.Int32
			release := make(chan struct{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/wait" { // a long-poll: held until released
					<-release
				}
			}))
			srv.EnableHTTP2 = tc.http2
			srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.Server},
				ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: p.CA.Pool(),
				GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { hellos.Add(1); return nil, nil }}
			srv.StartTLS()
			t.Cleanup(srv.Close)
			c, err := newClient(srv.URL, p.CA.Pool(), nil)
			if err != nil {
				t.Fatal(err)
			}
			c.setCertificate(p.Node)
			var wg sync.WaitGroup
			var beats atomic.Int32
			errs := make(chan error, 6)
			for i := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					path := "/beat"
					if i%2 == 0 {
						path = "/wait"
					}
					resp, err := c.http.Get(srv.URL + path)
					if err != nil {
						errs <- err
						return
					}
					resp.Body.Close()
					if path == "/beat" {
						beats.Add(1)
					}
				}()
			}
			deadline := time.Now().Add(10 * time.Second)
			for beats.Load() < 3 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := beats.Load(); n < 3 {
				t.Errorf("%d of 3 heartbeats answered while the long-polls were held", n)
			}
			close(release)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("request: %v", err)
			}
			if n := hellos.Load(); tc.handshakes != 0 && n != tc.handshakes {
				t.Errorf("%d TLS handshakes for 6 concurrent requests, want %d", n, tc.handshakes)
			}
		})
	}
}
