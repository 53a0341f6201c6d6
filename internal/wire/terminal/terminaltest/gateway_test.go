package terminaltest_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/terminal"
	"github.com/drover-dev/drover/internal/wire/terminal/terminaltest"
)

// TestGateway: the stub refuses what the real gateway refuses (no client
// certificate, a certificate for another node, a wrong nonce) with the
// same statuses and codes, and hands an accepted stream's frames to the
// test both ways.
func TestGateway(t *testing.T) {
	fx := terminaltest.NewPKI(t, "test CA", "node-1")
	g := terminaltest.New(t, terminaltest.Options{Nonce: "n0nce", TLS: &tls.Config{MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{fx.Server}, ClientCAs: fx.CA.Pool(), ClientAuth: tls.VerifyClientCertIfGiven}})
	client := func(withCert bool) *http.Client {
		c := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: fx.CA.Pool()}
		if withCert {
			c.Certificates = []tls.Certificate{fx.Node}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
	}
	dial := func(withCert bool, node, nonce string) (*websocket.Conn, *http.Response, error) {
		hdr := http.Header{}
		hdr.Set(terminal.HeaderNonce, nonce)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return websocket.Dial(ctx, g.URL()+nodeapi.TerminalStream.Path(node, "ts-1"), &websocket.DialOptions{
			HTTPClient: client(withCert), HTTPHeader: hdr, Subprotocols: []string{terminal.Subprotocol}})
	}
	for _, tc := range []struct {
		name   string
		cert   bool
		node   string
		nonce  string
		status int
		code   string
	}{
		{"no certificate", false, "node-1", "n0nce", http.StatusUnauthorized, "client_certificate_required"},
		{"another node's path", true, "node-2", "n0nce", http.StatusForbidden, "node_mismatch"},
		{"wrong nonce", true, "node-1", "other", http.StatusForbidden, "terminal_nonce_mismatch"},
	} {
		_, resp, err := dial(tc.cert, tc.node, tc.nonce)
		if err == nil || resp == nil || resp.StatusCode != tc.status {
			t.Errorf("%s: dial = %v (response %+v), want %d", tc.name, err, resp, tc.status)
			continue
		}
		var body api.ErrorBody
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error.Code != tc.code {
			t.Errorf("%s: error body %+v (%v), want code %s", tc.name, body, err, tc.code)
		}
	}
	if g.Pending() {
		t.Fatal("a refused dial reached the test")
	}

	c, _, err := dial(true, "node-1", "n0nce")
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	s := g.Stream(5 * time.Second)
	if s.Node != "node-1" || s.Req.URL.Path != nodeapi.TerminalStream.Path("node-1", "ts-1") {
		t.Errorf("stream from %q on %s", s.Node, s.Req.URL.Path)
	}
	ctx := context.Background()
	ready, _ := terminal.EncodeControl(terminal.Ready("ts-1"))
	for _, m := range [][]byte{terminal.Encode(terminal.ChanStdout, []byte("hello ")), terminal.Encode(terminal.ChanStdout, []byte("world")),
		terminal.Encode(terminal.ChanControl, ready)} {
		if err := c.Write(ctx, websocket.MessageBinary, m); err != nil {
			t.Fatal(err)
		}
	}
	if ctl, out := s.UntilControl(5 * time.Second); ctl.Type != terminal.TypeReady || out != "hello world" {
		t.Errorf("UntilControl = %+v after %q", ctl, out)
	}
	s.Stdin("ls\n")
	_, msg, err := c.Read(ctx)
	if ch, payload, derr := terminal.Decode(msg); err != nil || derr != nil || ch != terminal.ChanStdin || string(payload) != "ls\n" {
		t.Errorf("node read %s %q (%v, %v)", ch, payload, err, derr)
	}
	c.Close(websocket.StatusCode(4000), "bye")
	if code := s.CloseStatus(5 * time.Second); code != 4000 {
		t.Errorf("CloseStatus = %d, want 4000", code)
	}
}
