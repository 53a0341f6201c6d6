package termnode_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/task"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestOpenDialFailures checks that every way the stream can fail to connect
// maps to the code naming the failed hop, and that no console is started.
func TestOpenDialFailures(t *testing.T) {
	t.Parallel()
	fx := newPKI(t)
	status := func(code int, body string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if body == "" {
				http.Error(w, "nope", code)
				return
			}
			writeAPIError(w, code, body, "refused by the test gateway")
		})
	}
	// A TCP listener that never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	// A port with nothing listening.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "https://" + free.Addr().String()
	free.Close()
	// A plain HTTP server.
	plain := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(plain.Close)
	// A WebSocket server that selects no subprotocol.
	noProto := startGateway(t, fx, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err == nil {
			c.CloseNow()
		}
	}))

	cases := []struct {
		name    string
		url     func(t *testing.T) string
		tls     func() *tls.Config
		code    string
		msgPart string
	}{
		{"client cert from an untrusted CA", func(t *testing.T) string { return startGateway(t, fx, status(200, "")).URL },
			clientTLS(fx.pool, fx.otherCert), termnode.CodeNodeStreamMTLSFailed, "TLS"},
		{"server cert from an untrusted CA", func(t *testing.T) string { return startGateway(t, fx, status(200, "")).URL },
			clientTLS(fx.otherPool, fx.client), termnode.CodeNodeStreamMTLSFailed, "TLS handshake"},
		{"no TLS config", func(t *testing.T) string { return startGateway(t, fx, status(200, "")).URL },
			func() *tls.Config { return nil }, termnode.CodeNodeStreamMTLSFailed, "no node certificate"},
		{"401 client_certificate_required", func(t *testing.T) string { return startGateway(t, fx, status(401, "client_certificate_required")).URL },
			clientTLS(fx.pool, fx.client), termnode.CodeNodeStreamMTLSFailed, "client_certificate_required"},
		{"403 terminal_session_wrong_node", func(t *testing.T) string { return startGateway(t, fx, status(403, "terminal_session_wrong_node")).URL },
			clientTLS(fx.pool, fx.client), termnode.CodeSessionRejected, "403 terminal_session_wrong_node"},
		{"404 terminal_session_unknown", func(t *testing.T) string { return startGateway(t, fx, status(404, "terminal_session_unknown")).URL },
			clientTLS(fx.pool, fx.client), termnode.CodeSessionRejected, "terminal_session_unknown"},
		{"409 terminal_stream_exists", func(t *testing.T) string { return startGateway(t, fx, status(409, "terminal_stream_exists")).URL },
			clientTLS(fx.pool, fx.client), termnode.CodeSessionRejected, "terminal_stream_exists"},
		{"410 terminal_session_closed", func(t *testing.T) string { return startGateway(t, fx, status(410, "terminal_session_closed")).URL },
			clientTLS(fx.pool, fx.client), termnode.CodeSessionRejected, "terminal_session_closed"},
		{"404 without an envelope: not the gateway", func(t *testing.T) string { return startGateway(t, fx, status(404, "")).URL },
			clientTLS(fx.pool, fx.client), termnode.CodeNodeStreamTimeout, "NODE_AGENT_TERMINAL_URL"},
		{"redirect is not followed", func(t *testing.T) string {
			return startGateway(t, fx, http.RedirectHandler("https://example.invalid/", http.StatusFound)).URL
		}, clientTLS(fx.pool, fx.client), termnode.CodeNodeStreamTimeout, "HTTP 302"},
		{"nothing listening", func(*testing.T) string { return refused },
			clientTLS(fx.pool, fx.client), termnode.CodeNodeStreamTimeout, "cannot reach"},
		{"endpoint never answers", func(*testing.T) string { return "https://" + silent.Addr().String() },
			clientTLS(fx.pool, fx.client), termnode.CodeNodeStreamTimeout, "did not answer"},
		{"plain HTTP endpoint", func(*testing.T) string { return "https://" + strings.TrimPrefix(plain.URL, "http://") },
			clientTLS(fx.pool, fx.client), termnode.CodeNodeStreamTimeout, "does not speak TLS"},
		{"no subprotocol selected", func(*testing.T) string { return noProto.URL },
			clientTLS(fx.pool, fx.client), termnode.CodeSessionRejected, "subprotocol"},
		{"http URL", func(*testing.T) string { return plain.URL },
			clientTLS(fx.pool, fx.client), termnode.CodeNodeStreamTimeout, "https://"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := newManager(t, nil, tc.tls, func(c *termnode.Config) {
				c.BaseURL = tc.url(t)
				c.DialTimeout = time.Second
			})
			var phases []string
			p := ptyParams(t, "nobody")
			res, err := m.Open(context.Background(), p, "cid-dial", func(phase string, _ time.Duration, err error) {
				phases = append(phases, phase)
				if err == nil {
					t.Errorf("phase %s reported success", phase)
				}
			})
			if err == nil {
				t.Fatalf("Open succeeded: %+v", res)
			}
			if got := codeOf(t, err); got != tc.code {
				t.Errorf("code = %q, want %q (err: %v)", got, tc.code, err)
			}
			if !strings.Contains(err.Error(), tc.msgPart) {
				t.Errorf("error %q does not mention %q", err, tc.msgPart)
			}
			if strings.Join(phases, ",") != "stream_connect" {
				t.Errorf("phases = %v, want only stream_connect", phases)
			}
			if m.Active() != 0 {
				t.Errorf("Active = %d after a failed open", m.Active())
			}
		})
	}
}

// TestOpenChecksParams checks Open's own guard on params.
func TestOpenChecksParams(t *testing.T) {
	t.Parallel()
	m := termnode.New(termnode.Config{NodeID: testNode, BaseURL: "https://127.0.0.1:1", Logger: quietLogger()})
	defer m.Close()
	base := ptyParams(t, "nobody")
	cases := map[string]func(*task.TerminalOpenParams){
		"no session id":    func(p *task.TerminalOpenParams) { p.SessionID = "" },
		"no nonce":         func(p *task.TerminalOpenParams) { p.Nonce = "" },
		"bad mode":         func(p *task.TerminalOpenParams) { p.Mode = "ssh" },
		"pty without user": func(p *task.TerminalOpenParams) { p.Username = "" },
		"serial without instance": func(p *task.TerminalOpenParams) {
			p.Mode, p.Username = task.TerminalModeSerial, ""
		},
		"zero size":   func(p *task.TerminalOpenParams) { p.Cols = 0 },
		"no lifetime": func(p *task.TerminalOpenParams) { p.MaxLifetime = 0 },
	}
	for name, mod := range cases {
		p := base
		mod(&p)
		if _, err := m.Open(context.Background(), p, "", nil); termnode.CodeOf(err) != termnode.CodeInvalidParams {
			t.Errorf("%s: err = %v, want %s", name, err, termnode.CodeInvalidParams)
		}
	}
}

// TestOpenAfterClose checks that a closed Manager opens nothing.
func TestOpenAfterClose(t *testing.T) {
	t.Parallel()
	m := termnode.New(termnode.Config{NodeID: testNode, BaseURL: "https://127.0.0.1:1", Logger: quietLogger()})
	m.Close()
	if _, err := m.Open(context.Background(), ptyParams(t, "nobody"), "", nil); termnode.CodeOf(err) != termnode.CodeShuttingDown {
		t.Fatalf("Open after Close: %v, want %s", err, termnode.CodeShuttingDown)
	}
}
