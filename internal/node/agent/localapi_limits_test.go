package agent

import (
	"bytes"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
)

// TestLocalAPISlowClients: the local API server cuts off a client that
// never finishes its headers, one that trickles a body one byte at a time,
// and an idle keep-alive connection, each within its limit (generous upper
// bounds, no lower ones), and refuses oversized headers.
func TestLocalAPISlowClients(t *testing.T) {
	t.Parallel()
	lim := localLimits{readHeader: 300 * time.Millisecond, read: 600 * time.Millisecond, write: 2 * time.Second,
		idle: 500 * time.Millisecond, maxHeaderBytes: 4 << 10}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeLocalJSON(w, http.StatusOK, "ok") })
	srv := newLocalServer(mux, lim)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const within = 5 * time.Second
	slowHeaders := strings.Repeat("X-Slow: 1\r\n", 20)

	t.Run("headers never finish", func(t *testing.T) {
		testutil.Trickle(t, dial(), "GET /healthz HTTP/1.1\r\nHost: x\r\n", slowHeaders, 100*time.Millisecond, within)
	})
	t.Run("body trickles", func(t *testing.T) {
		testutil.Trickle(t, dial(), "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
			strings.Repeat("a", 100), time.Second, within)
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		_, got := testutil.Trickle(t, dial(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "", 0, within)
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 200")) {
			t.Fatalf("got %q, want a 200 before the idle close", got)
		}
	})
	t.Run("oversized headers", func(t *testing.T) {
		_, got := testutil.Trickle(t, dial(), "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("b", 64<<10)+"\r\n\r\n",
			"", 0, within)
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 431")) {
			t.Fatalf("got %q, want 431", got)
		}
	})
}
