//go:build linux

package termnode_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// TestOpenDialsSignedStreamURL: with stream_url in the params the agent
// dials that replica, not its configured URL (here a gateway that knows no
// session, as a load balancer's other replica would answer).
func TestOpenDialsSignedStreamURL(t *testing.T) {
	t.Parallel()
	fx := newPKI(t)
	p := ptyParams(t, currentUser(t))
	g := newGateway(t, fx, p.Nonce)
	other := startGateway(t, fx, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeAPIError(w, http.StatusNotFound, "terminal_session_unknown", "not on this replica")
	}))
	m := shManager(t, nil, fx, currentUser(t), func(c *termnode.Config) { c.BaseURL = other.URL })
	p.StreamURL = g.URL()
	if _, err := m.Open(context.Background(), p, "cid-stream-url", nil); err != nil {
		t.Fatalf("Open with stream_url: %v", err)
	}
	s := g.waitStream()
	if c := s.Control(10 * time.Second); c.Type != terminal.TypeReady {
		t.Fatalf("first frame = %+v, want ready", c)
	}

	// Without stream_url the configured URL is dialed (older control
	// planes): the other replica refuses the session.
	p2 := ptyParams(t, currentUser(t))
	if _, err := m.Open(context.Background(), p2, "cid-no-stream-url", nil); codeOf(t, err) != termnode.CodeSessionRejected ||
		!strings.Contains(err.Error(), "terminal_session_unknown") {
		t.Fatalf("Open without stream_url: %v, want the configured URL's terminal_session_unknown", err)
	}
}

// TestOpenRefusesForeignStreamURL: a stream_url that is not https, or
// whose server certificate does not chain to the pinned control plane CA,
// is never handed the nonce.
func TestOpenRefusesForeignStreamURL(t *testing.T) {
	t.Parallel()
	fx := newPKI(t)
	reached := make(chan string, 4)
	foreign := startGateway(t, &pkiFixture{server: fx.otherSvCrt, pool: fx.otherPool},
		http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { reached <- r.Header.Get(terminal.HeaderNonce) }))
	g := newGateway(t, fx, "unused")
	for name, tc := range map[string]struct{ url, code, part string }{
		"http scheme":   {"http://" + strings.TrimPrefix(g.URL(), "https://"), termnode.CodeNodeStreamTimeout, "https://"},
		"ws scheme":     {"ws://" + strings.TrimPrefix(g.URL(), "https://"), termnode.CodeNodeStreamTimeout, "https://"},
		"another CA":    {foreign.URL, termnode.CodeNodeStreamMTLSFailed, "TLS handshake"},
		"not a URL":     {"https://%zz", termnode.CodeNodeStreamTimeout, "stream URL"},
		"missing host ": {"https:///x", termnode.CodeNodeStreamTimeout, "https://"},
	} {
		m := newManager(t, g, clientTLS(fx.pool, fx.client), func(c *termnode.Config) { c.DialTimeout = 2 * time.Second })
		p := ptyParams(t, "nobody")
		p.StreamURL = tc.url
		_, err := m.Open(context.Background(), p, "cid-foreign", nil)
		if err == nil {
			t.Fatalf("%s: Open succeeded", name)
		}
		if got := codeOf(t, err); got != tc.code || !strings.Contains(err.Error(), tc.part) {
			t.Errorf("%s: %v (code %s), want %s mentioning %q", name, err, got, tc.code, tc.part)
		}
	}
	select {
	case n := <-reached:
		t.Fatalf("the foreign server received a request (nonce %q)", n)
	default:
	}
}
