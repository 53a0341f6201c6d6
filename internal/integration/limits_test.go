package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// shortHTTPLimits are listener limits small enough to watch them act.
func shortHTTPLimits(c *server.Config) {
	c.ReadHeaderTimeout = 300 * time.Millisecond
	c.BodyReadTimeout = 600 * time.Millisecond
	c.IdleTimeout = 500 * time.Millisecond
	c.MaxHeaderBytes = 8 << 10
}

// cutOffWithin is the generous upper bound for a slow client to be cut off
// under shortHTTPLimits.
const cutOffWithin = 5 * time.Second

// metric reads one series from the operator listener's /metrics (0 when
// absent).
func (e *env) metric(series string) float64 {
	e.t.Helper()
	resp, err := http.Get(e.opURL + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

func (e *env) waitMetric(series string, want float64, within time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := e.metric(series)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s = %g after %s, want %g", series, got, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) dialOperator() net.Conn {
	e.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.opURL, "http://"))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// dialNode opens an HTTP/1.1 TLS connection to the node listener, without
// a client certificate.
func (e *env) dialNode() net.Conn {
	e.t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.srv.CAPEM())
	c, err := tls.Dial("tcp", strings.TrimPrefix(e.nodeURL, "https://"),
		&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"}})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// TestListenerSlowClients: both listeners cut off a client that never
// finishes its headers (or, on the node listener, its TLS handshake), one
// that trickles a body one byte per second, and an idle keep-alive
// connection, each within a generous bound of its limit; oversized headers
// are refused with 431.
func TestListenerSlowClients(t *testing.T) {
	e := startEnv(t, openSQLite(t), shortHTTPLimits)
	slowHeaders := strings.Repeat("X-Slow: 1\r\n", 100)
	every := 100 * time.Millisecond

	t.Run("operator headers never finish", func(t *testing.T) {
		testutil.Trickle(t, e.dialOperator(), "GET /healthz HTTP/1.1\r\nHost: x\r\n", slowHeaders, every, cutOffWithin)
	})
	t.Run("operator body trickles", func(t *testing.T) {
		head := "POST /api/v1/tokens HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + e.opToken +
			"\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n{\"name\":\""
		_, got := testutil.Trickle(t, e.dialOperator(), head, strings.Repeat("a", 60), time.Second, cutOffWithin)
		if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 4")) {
			t.Fatalf("answer %q, want a 4xx or nothing", got)
		}
	})
	t.Run("operator idle keep-alive", func(t *testing.T) {
		_, got := testutil.Trickle(t, e.dialOperator(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "", 0, cutOffWithin)
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 200")) {
			t.Fatalf("got %q, want 200 before the idle close", got)
		}
	})
	t.Run("operator oversized headers", func(t *testing.T) {
		_, got := testutil.Trickle(t, e.dialOperator(),
			"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("b", 64<<10)+"\r\n\r\n", "", 0, cutOffWithin)
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 431")) {
			t.Fatalf("got %q, want 431", got)
		}
	})
	t.Run("node TLS handshake never starts", func(t *testing.T) {
		c, err := net.Dial("tcp", strings.TrimPrefix(e.nodeURL, "https://"))
		if err != nil {
			t.Fatal(err)
		}
		testutil.Trickle(t, c, "", "", 0, cutOffWithin)
	})
	t.Run("node headers never finish", func(t *testing.T) {
		testutil.Trickle(t, e.dialNode(), "POST /internal/v1/register HTTP/1.1\r\nHost: x\r\n", slowHeaders, every, cutOffWithin)
	})
	t.Run("node register body trickles", func(t *testing.T) {
		head := "POST /internal/v1/register HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Content-Length: 200\r\n\r\n{\"host_id\":\""
		_, got := testutil.Trickle(t, e.dialNode(), head, strings.Repeat("h", 180), time.Second, cutOffWithin)
		if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 4")) {
			t.Fatalf("answer %q, want a 4xx or nothing", got)
		}
	})
}

// TestLongLivedRequestsOutliveBodyTimeout: requests without a body are not
// bound by the body deadline, so task long-polls (HTTP/1.1 and HTTP/2) and
// both WebSocket legs of a terminal stay open well past every listener
// limit.
func TestLongLivedRequestsOutliveBodyTimeout(t *testing.T) {
	e := startEnv(t, openSQLite(t), shortHTTPLimits, func(c *server.Config) {
		c.Terminal = server.TerminalConfig{DispatchTimeout: 5 * time.Second, NodeStreamTimeout: 5 * time.Second,
			PTYTimeout: 5 * time.Second, KeepAlive: 20 * time.Second}
	})
	n := e.scriptedNode("node-a")
	for _, h2 := range []bool{false, true} {
		cl := e.rawClient(&n.cert)
		if !h2 {
			tr := cl.Transport.(*http.Transport)
			tr.ForceAttemptHTTP2 = false
			tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		st, code, body := e.nodeCall(cl, http.MethodGet, nodePath("node-a", "/tasks/wait?timeout=2s"), nil)
		if st != http.StatusNoContent {
			t.Fatalf("long-poll (h2 %v) past the body timeout: %d %s %s", h2, st, code, body)
		}
	}

	e.activeAllocation("alc_a", "node-a", "alice")
	tok := e.mintToken("alc_a", api.TerminalTokenRequest{})
	br := e.dialTerminal(tok, wsOpts{})
	p := openParams(t, n.claim(5*time.Second))
	node, st, code := e.dialStream(&n.cert, "node-a", tok.SessionID, p.Nonce)
	if node == nil {
		t.Fatalf("node stream refused: %d %s", st, code)
	}
	writeCtl(t, node, terminal.Ready(tok.SessionID))
	br.waitReady(5 * time.Second)
	time.Sleep(1500 * time.Millisecond) // past header, body and idle limits, no traffic
	if err := node.Write(context.Background(), websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, []byte("still here\n"))); err != nil {
		t.Fatalf("node write after the limits: %v", err)
	}
	br.readUntil("still here\n", 5*time.Second)
	br.send(terminal.ChanStdin, []byte("x"))
	nodeFrames := readAll(node)
	select {
	case f := <-nodeFrames:
		if f.err != nil || f.ch != terminal.ChanStdin {
			t.Fatalf("node got %+v, want the browser's stdin", f)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("browser input did not reach the node")
	}
}

// longPoll is a node long-poll running in the background.
type longPoll struct {
	cancel context.CancelFunc
	done   chan struct{}
	status int
}

func (e *env) startLongPoll(c *http.Client, path string) *longPoll {
	ctx, cancel := context.WithCancel(context.Background())
	lp := &longPoll{cancel: cancel, done: make(chan struct{})}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.nodeURL+path, nil)
	go func() {
		defer close(lp.done)
		if resp, err := c.Do(req); err == nil {
			lp.status = resp.StatusCode
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	e.t.Cleanup(func() { cancel(); <-lp.done })
	return lp
}

// nodeGet calls a node route and returns status, error code and the
// Retry-After header.
func (e *env) nodeGet(c *http.Client, path string) (int, string, string) {
	e.t.Helper()
	resp, err := c.Get(e.nodeURL + path)
	if err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	return resp.StatusCode, eb.Error.Code, resp.Header.Get("Retry-After")
}

// TestNodeLongPollLimit: a node may hold NodeLongPollLimit task long-polls
// and as many instance long-polls; one more of either is 429
// node_long_poll_limit with Retry-After, at once rather than held. Plain
// (non-waiting) desired-set reads and other nodes are not affected, and a
// slot is free again once a poll ends.
func TestNodeLongPollLimit(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.NodeLongPollLimit = 2; c.MaxWait = 30 * time.Second })
	a := e.enroll("node-a", e.createHost("node-a").Token)
	b := e.enroll("node-b", e.createHost("node-b").Token)

	tasksWait := nodePath("node-a", "/tasks/wait?timeout=30s")
	polls := []*longPoll{e.startLongPoll(a.client, tasksWait), e.startLongPoll(a.client, tasksWait)}
	e.waitMetric(`drover_node_long_polls{route="tasks"}`, 2, 5*time.Second)
	start := time.Now()
	st, code, after := e.nodeGet(a.client, tasksWait)
	if st != http.StatusTooManyRequests || code != "node_long_poll_limit" || after == "" {
		t.Fatalf("third task long-poll: %d %s Retry-After %q, want 429 node_long_poll_limit with Retry-After", st, code, after)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("refusal took %s; it must not wait", d)
	}
	if st, code, _ := e.nodeGet(b.client, nodePath("node-b", "/tasks/wait?timeout=100ms")); st != http.StatusNoContent {
		t.Fatalf("node B's long-poll: %d %s", st, code)
	}

	var set api.NodeInstances
	st, _, body := e.nodeCall(a.client, http.MethodGet, nodePath("node-a", "/instances"), nil)
	if st != http.StatusOK || json.Unmarshal(body, &set) != nil {
		t.Fatalf("desired set: %d %s", st, body)
	}
	instWait := nodePath("node-a", "/instances?etag="+set.ETag+"&wait=30s")
	polls = append(polls, e.startLongPoll(a.client, instWait), e.startLongPoll(a.client, instWait))
	e.waitMetric(`drover_node_long_polls{route="instances"}`, 2, 5*time.Second)
	if st, code, after := e.nodeGet(a.client, instWait); st != http.StatusTooManyRequests || code != "node_long_poll_limit" || after == "" {
		t.Fatalf("third instances long-poll: %d %s Retry-After %q", st, code, after)
	}
	if st, code, _ := e.nodeGet(a.client, nodePath("node-a", "/instances")); st != http.StatusOK {
		t.Fatalf("plain desired-set read at the cap: %d %s", st, code)
	}

	// A poll that ends frees its slot.
	polls[0].cancel()
	<-polls[0].done
	e.waitMetric(`drover_node_long_polls{route="tasks"}`, 1, 5*time.Second)
	if st, code, _ := e.nodeGet(a.client, nodePath("node-a", "/tasks/wait?timeout=100ms")); st != http.StatusNoContent {
		t.Fatalf("long-poll after one ended: %d %s", st, code)
	}
	if got := e.metric(`drover_limit_refusals_total{code="node_long_poll_limit"}`); got != 2 {
		t.Fatalf("node_long_poll_limit refusals = %g, want 2", got)
	}
	var wg sync.WaitGroup
	for _, p := range polls {
		wg.Go(func() { p.cancel(); <-p.done })
	}
	wg.Wait()
}
