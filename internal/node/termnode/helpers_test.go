package termnode_test

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
	"github.com/drover-dev/drover/internal/wire/terminal/terminaltest"
)

const testNode = "node-1"

// pkiFixture is a CA with a server certificate for 127.0.0.1 and a node
// client certificate, plus a second, unrelated CA.
type pkiFixture struct {
	pool       *x509.CertPool
	server     tls.Certificate
	client     tls.Certificate
	otherPool  *x509.CertPool
	otherCert  tls.Certificate // a node certificate from the other CA
	otherSvCrt tls.Certificate // a server certificate from the other CA
}

func newPKI(t *testing.T) *pkiFixture {
	t.Helper()
	fx := terminaltest.NewPKI(t, "test CA", testNode)
	other := terminaltest.NewPKI(t, "other CA", testNode)
	return &pkiFixture{pool: fx.CA.Pool(), server: fx.Server, client: fx.Node,
		otherPool: other.CA.Pool(), otherCert: other.Node, otherSvCrt: other.Server}
}

// clientTLS returns a TLSConfig func presenting cert and trusting roots.
func clientTLS(roots *x509.CertPool, cert tls.Certificate) func() *tls.Config {
	return func() *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
	}
}

// startGateway serves h over TLS with the fixture's server certificate,
// requiring client certificates from the fixture's CA.
func startGateway(t *testing.T, fx *pkiFixture, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{fx.server},
		ClientCAs: fx.pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point of some tests
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// gateway is the terminal gateway's node-facing stream route
// (terminaltest) on the fixture's mTLS listener: it requires a node
// certificate from the fixture's CA naming the path's node, and the nonce.
type gateway struct {
	*terminaltest.Gateway
}

// stream is the gateway's end of a node stream.
type stream = terminaltest.Stream

func newGateway(t *testing.T, fx *pkiFixture, nonce string, opts ...func(*terminaltest.Options)) *gateway {
	t.Helper()
	o := terminaltest.Options{Nonce: nonce, TLS: &tls.Config{MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{fx.server}, ClientCAs: fx.pool, ClientAuth: tls.RequireAndVerifyClientCert}}
	for _, f := range opts {
		f(&o)
	}
	return &gateway{terminaltest.New(t, o)}
}

func writeAPIError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: msg}})
}

// waitStream returns the next stream the gateway accepted.
func (g *gateway) waitStream() *stream { return g.Stream(10 * time.Second) }

// untilControl skips stdout until a control frame arrives and returns it.
func untilControl(s *stream, timeout time.Duration) terminal.Control {
	c, _ := s.UntilControl(timeout)
	return c
}

func randHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// ptyParams are the params of a PTY session for username.
func ptyParams(t *testing.T, username string) task.TerminalOpenParams {
	return task.TerminalOpenParams{SessionID: "ts-" + randHex(t, 6), AllocationID: "alloc-1", Nonce: randHex(t, 32),
		Mode: task.TerminalModePTY, Username: username, Cols: 80, Rows: 24, MaxLifetime: api.Duration(time.Hour)}
}

func newManager(t *testing.T, g *gateway, tlsCfg func() *tls.Config, mod ...func(*termnode.Config)) *termnode.Manager {
	t.Helper()
	cfg := termnode.Config{NodeID: testNode, TLSConfig: tlsCfg, Logger: quietLogger(), DialTimeout: 5 * time.Second}
	if g != nil {
		cfg.BaseURL = g.URL()
	}
	for _, f := range mod {
		f(&cfg)
	}
	m := termnode.New(cfg)
	t.Cleanup(m.Close)
	return m
}

// codeOf returns the *termnode.Error code of err.
func codeOf(t *testing.T, err error) string {
	t.Helper()
	var e *termnode.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *termnode.Error", err, err)
	}
	return e.Code
}

// waitActive waits until m runs n sessions.
func waitActive(t *testing.T, m *termnode.Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.Active() != n {
		if time.Now().After(deadline) {
			t.Fatalf("Active = %d, want %d", m.Active(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
