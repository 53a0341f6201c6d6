package termnode_test

import (
	"context"
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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
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
	now := time.Now()
	mk := func(name string) (*pki.CA, tls.Certificate, tls.Certificate) {
		certPEM, keyPEM, err := pki.NewCA(name, now)
		if err != nil {
			t.Fatal(err)
		}
		ca, err := pki.LoadCA(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := ca.ServerCertificate([]string{"127.0.0.1"}, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		nodeKey, err := pki.NewNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		csr, err := pki.CSRFor(nodeKey)
		if err != nil {
			t.Fatal(err)
		}
		nodePEM, _, _, err := ca.SignNodeCSR(csr, testNode, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		client, err := tls.X509KeyPair(nodePEM, nodeKey)
		if err != nil {
			t.Fatal(err)
		}
		return ca, srv, client
	}
	ca, srv, client := mk("test CA")
	other, otherSrv, otherClient := mk("other CA")
	return &pkiFixture{pool: ca.Pool(), server: srv, client: client,
		otherPool: other.Pool(), otherCert: otherClient, otherSvCrt: otherSrv}
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

// event is one thing the gateway's end of a stream saw.
type event struct {
	ch      terminal.Channel
	payload []byte
	closed  error // set on the last event: the read error (a CloseError for a close frame)
}

// stream is the gateway's end of a node stream; its reader pushes every
// frame to events (unbuffered when the gateway was built with buf 0, so
// the test's consumption paces the node).
type stream struct {
	t      *testing.T
	conn   *websocket.Conn
	events chan event
	req    *http.Request
	done   <-chan struct{}
}

// gateway accepts node streams on the node-facing route, checking the path
// and the nonce like the real gateway, and hands them to the test.
type gateway struct {
	t       *testing.T
	srv     *httptest.Server
	nonce   string
	buf     int
	delay   time.Duration // per frame read, for the first delayN frames
	delayN  int
	noRead  bool // accept and never read (pings go unanswered)
	streams chan *stream
	done    chan struct{} // closed when the test ends
	wg      sync.WaitGroup
}

func newGateway(t *testing.T, fx *pkiFixture, nonce string, opts ...func(*gateway)) *gateway {
	t.Helper()
	g := &gateway{t: t, nonce: nonce, buf: 4096, streams: make(chan *stream, 4), done: make(chan struct{})}
	for _, o := range opts {
		o(g)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(nodeapi.TerminalStream.MuxPattern(), g.serve)
	g.srv = startGateway(t, fx, mux)
	t.Cleanup(g.wg.Wait)
	t.Cleanup(func() { close(g.done) }) // runs first
	return g
}

func writeAPIError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: msg}})
}

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != r.PathValue("id") {
		writeAPIError(w, http.StatusForbidden, "node_mismatch", "certificate does not name this node")
		return
	}
	if r.Header.Get(terminal.HeaderNonce) != g.nonce {
		writeAPIError(w, http.StatusForbidden, "terminal_nonce_mismatch", "nonce mismatch")
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{terminal.Subprotocol}})
	if err != nil {
		g.t.Errorf("accept: %v", err)
		return
	}
	s := &stream{t: g.t, conn: conn, events: make(chan event, g.buf), req: r, done: g.done}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer conn.CloseNow()
		if g.noRead {
			<-g.done
			close(s.events)
			return
		}
		s.read(g.delay, g.delayN)
	}()
	g.streams <- s
}

func (s *stream) read(delay time.Duration, delayN int) {
	defer close(s.events)
	for i := 0; ; i++ {
		if i < delayN {
			time.Sleep(delay)
		}
		_, msg, err := s.conn.Read(context.Background())
		ev := event{closed: err}
		if err == nil {
			if ev.ch, ev.payload, err = terminal.Decode(msg); err != nil {
				s.t.Errorf("gateway got a bad frame: %v", err)
				continue
			}
		}
		select {
		case s.events <- ev:
		case <-s.done:
			return
		}
		if ev.closed != nil {
			return
		}
	}
}

// next returns the next event, failing the test after timeout.
func (s *stream) next(timeout time.Duration) event {
	s.t.Helper()
	select {
	case ev, ok := <-s.events:
		if !ok {
			s.t.Fatal("stream reader ended")
		}
		return ev
	case <-time.After(timeout):
		s.t.Fatalf("no frame from the node within %s", timeout)
	}
	return event{}
}

// control reads the next frame and requires a control message.
func (s *stream) control(timeout time.Duration) terminal.Control {
	s.t.Helper()
	ev := s.next(timeout)
	if ev.closed != nil || ev.ch != terminal.ChanControl {
		s.t.Fatalf("want a control frame, got channel %s %q (closed: %v)", ev.ch, ev.payload, ev.closed)
	}
	c, err := terminal.DecodeControl(ev.payload)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// readUntil collects stdout until it contains want; a control frame or the
// end of the stream before that fails the test. It returns what it read.
func (s *stream) readUntil(want string, timeout time.Duration) string {
	s.t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(timeout)
	for !strings.Contains(out.String(), want) {
		ev := s.next(time.Until(deadline))
		if ev.closed != nil || ev.ch != terminal.ChanStdout {
			s.t.Fatalf("waiting for %q: got channel %s %q (closed: %v); output so far:\n%s", want, ev.ch, ev.payload, ev.closed, out.String())
		}
		out.Write(ev.payload)
	}
	return out.String()
}

// untilControl skips stdout until a control frame arrives and returns it.
func (s *stream) untilControl(timeout time.Duration) terminal.Control {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ev := s.next(time.Until(deadline))
		if ev.closed != nil {
			s.t.Fatalf("stream closed before a control frame: %v", ev.closed)
		}
		if ev.ch == terminal.ChanControl {
			c, err := terminal.DecodeControl(ev.payload)
			if err != nil {
				s.t.Fatal(err)
			}
			return c
		}
	}
}

// closeStatus waits for the end of the stream (skipping frames) and returns
// the close code the node sent.
func (s *stream) closeStatus(timeout time.Duration) websocket.StatusCode {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ev := s.next(time.Until(deadline))
		if ev.closed != nil {
			return websocket.CloseStatus(ev.closed)
		}
	}
}

func (s *stream) send(ch terminal.Channel, payload []byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.conn.Write(ctx, websocket.MessageBinary, terminal.Encode(ch, payload)); err != nil {
		s.t.Fatalf("send %s: %v", ch, err)
	}
}

func (s *stream) stdin(text string) { s.t.Helper(); s.send(terminal.ChanStdin, []byte(text)) }

// waitStream returns the next stream the gateway accepted.
func (g *gateway) waitStream() *stream {
	g.t.Helper()
	select {
	case s := <-g.streams:
		return s
	case <-time.After(10 * time.Second):
		g.t.Fatal("the node never opened a stream")
	}
	return nil
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
		cfg.BaseURL = g.srv.URL
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
