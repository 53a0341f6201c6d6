// Package terminaltest is the terminal gateway's node-facing end for tests:
// an mTLS listener serving the node stream route from the node API's route
// table (nodeapi.TerminalStream), checking the node's certificate against
// the path and the session nonce as internal/cp/termgw does (same status
// codes and error codes), and handing each accepted stream to the test,
// which reads and writes terminal frames (internal/wire/terminal).
//
// Tests of the node side (the agent's terminal.open handler, termnode,
// the node-leg benchmark) use it where the real gateway would need a whole
// control plane. Only tests import it: the agent binary never links it.
package terminaltest

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// Options configure a Gateway.
type Options struct {
	// TLS is the listener's TLS configuration: its server certificate and
	// the CA its node client certificates must chain to. Nil serves
	// httptest's own certificate without asking for client certificates
	// and skips the node check (benchmarks of the stream alone).
	TLS *tls.Config
	// Nonce is the session nonce a stream must carry
	// (terminal.HeaderNonce); "" accepts any.
	Nonce string
	// Buffer is how many frames a stream's reader may hold before it
	// stops reading (so the test's consumption paces the node); 0 is
	// unbuffered. New defaults it to 4096 unless Unbuffered is set.
	Buffer     int
	Unbuffered bool
	// ReadDelay is slept before each of the first DelayFrames reads (a
	// slow gateway).
	ReadDelay   time.Duration
	DelayFrames int
	// Raw hands the connection to the test without reading it: the test
	// reads Stream.Conn itself, or never (pings go unanswered).
	Raw bool
	// ReadLimit is the connection's read limit (0: the websocket default).
	ReadLimit int64
}

// Gateway is the node-facing terminal stream route on its own listener.
type Gateway struct {
	Server  *httptest.Server
	t       testing.TB
	opts    Options
	streams chan *Stream
	done    chan struct{} // closed when the test ends
	wg      sync.WaitGroup
}

// New starts a gateway; it stops when the test ends.
func New(t testing.TB, o Options) *Gateway {
	t.Helper()
	if o.Buffer == 0 && !o.Unbuffered {
		o.Buffer = 4096
	}
	g := &Gateway{t: t, opts: o, streams: make(chan *Stream, 4), done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc(nodeapi.TerminalStream.MuxPattern(), g.serve)
	g.Server = httptest.NewUnstartedServer(mux)
	g.Server.TLS = o.TLS
	g.Server.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point of some tests
	g.Server.StartTLS()
	t.Cleanup(g.Server.Close)
	t.Cleanup(g.wg.Wait)
	t.Cleanup(func() { close(g.done) }) // runs first
	return g
}

// URL is the gateway's base URL (NODE_AGENT_TERMINAL_URL, termnode's BaseURL).
func (g *Gateway) URL() string { return g.Server.URL }

// refuse answers like the control plane: a status and an api.ErrorBody.
func refuse(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: msg}})
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	node := ""
	if g.opts.TLS != nil {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			refuse(w, http.StatusUnauthorized, "client_certificate_required", "a client certificate is required")
			return
		}
		id, err := pki.NodeID(r.TLS.PeerCertificates[0])
		if err != nil || id != r.PathValue("id") {
			refuse(w, http.StatusForbidden, "node_mismatch", "certificate does not name this node")
			return
		}
		node = id
	}
	if g.opts.Nonce != "" && r.Header.Get(terminal.HeaderNonce) != g.opts.Nonce {
		refuse(w, http.StatusForbidden, "terminal_nonce_mismatch", "the stream's nonce does not match")
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{terminal.Subprotocol}})
	if err != nil {
		g.t.Errorf("terminaltest: accept: %v", err)
		return
	}
	if g.opts.ReadLimit > 0 {
		conn.SetReadLimit(g.opts.ReadLimit)
	}
	s := &Stream{t: g.t, Conn: conn, Req: r, Node: node, events: make(chan Event, g.opts.Buffer), done: g.done}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer conn.CloseNow()
		if g.opts.Raw {
			close(s.events)
			<-g.done
			return
		}
		s.read(g.opts.ReadDelay, g.opts.DelayFrames)
	}()
	select {
	case g.streams <- s:
	case <-g.done:
	}
}

// Stream returns the next stream the gateway accepted, failing the test
// after timeout.
func (g *Gateway) Stream(timeout time.Duration) *Stream {
	g.t.Helper()
	select {
	case s := <-g.streams:
		return s
	case <-time.After(timeout):
		g.t.Fatalf("the node never opened a terminal stream within %s", timeout)
	}
	return nil
}

// Pending reports whether a stream was accepted that Stream has not
// returned yet.
func (g *Gateway) Pending() bool { return len(g.streams) > 0 }
