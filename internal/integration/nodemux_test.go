package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// noFallback fails a request the framed transport would send elsewhere:
// these tests must not pass over HTTP/2 by accident.
type noFallback struct{}

func (noFallback) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("fell back to HTTP/2")
}

// muxDial is a framed connection of its own with cert, offering only
// nodemux.Proto: the test reads and writes its frames (no goroutine).
func (e *env) muxDial(cert *tls.Certificate) *tls.Conn {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.srv.CAPEM())
	c, err := tls.Dial("tcp", strings.TrimPrefix(e.nodeURL, "https://"), &tls.Config{RootCAs: pool,
		MinVersion: tls.VersionTLS13, NextProtos: []string{nodemux.Proto}, ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{*cert}})
	if err != nil {
		e.t.Fatal(err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != nodemux.Proto {
		e.t.Fatalf("negotiated %q, want %s", p, nodemux.Proto)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// muxClient is a client of the node API over the framed connection
// (nodemux) with cert (nil: none), offering only nodemux.Proto.
func (e *env) muxClient(cert *tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.srv.CAPEM())
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, NextProtos: []string{nodemux.Proto}, ServerName: "127.0.0.1"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	addr := strings.TrimPrefix(e.nodeURL, "https://")
	tr := &nodemux.Transport{Fallback: noFallback{}, Dial: func(ctx context.Context) (net.Conn, string, error) {
		c, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, "", err
		}
		return c, c.(*tls.Conn).ConnectionState().NegotiatedProtocol, nil
	}}
	e.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// TestNodeMuxMatchesHTTP2: every answer of the node API over the framed
// connection is the one HTTP/2 gives, refusals included: the identity is
// the connection's client certificate, checked per request by the same
// handlers (no certificate, another node's routes, a revoked identity).
func TestNodeMuxMatchesHTTP2(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	a := e.enroll("node-a", e.createHost("node-a").Token)
	b := e.enroll("node-b", e.createHost("node-b").Token)
	hb := api.Heartbeat{AgentVersion: "mux", Capacity: &api.CapacityReport{Total: api.Capacity{VCPUs: 2, MemoryMiB: 2048}}}
	clients := map[string][2]*http.Client{ // HTTP/2, framed
		"a": {a.client, e.muxClient(&a.cert)}, "b": {b.client, e.muxClient(&b.cert)}, "none": {e.rawClient(nil), e.muxClient(nil)}}
	for _, tc := range []struct {
		name, who, method, path string
		body                    any
		want                    int
	}{
		{"own heartbeat", "a", http.MethodPost, nodePath("node-a", "/heartbeat"), hb, http.StatusOK},
		{"another node's heartbeat", "a", http.MethodPost, nodePath("node-b", "/heartbeat"), hb, http.StatusForbidden},
		{"no certificate", "none", http.MethodPost, nodePath("node-a", "/heartbeat"), hb, http.StatusUnauthorized},
		{"heartbeat not JSON", "b", http.MethodPost, nodePath("node-b", "/heartbeat"), "x", http.StatusUnprocessableEntity},
		{"empty long-poll", "b", http.MethodGet, nodePath("node-b", "/tasks/wait?timeout=10ms"), nil, http.StatusNoContent},
		{"bad timeout", "b", http.MethodGet, nodePath("node-b", "/tasks/wait?timeout=soon"), nil, http.StatusUnprocessableEntity},
		{"another node's tasks", "b", http.MethodGet, nodePath("node-a", "/tasks/wait?timeout=10ms"), nil, http.StatusForbidden},
		{"JWKS", "a", http.MethodGet, nodePath("node-a", "/jwks"), nil, http.StatusOK},
		{"unknown route", "a", http.MethodGet, "/internal/v1/nope", nil, http.StatusNotFound},
		{"wrong method", "a", http.MethodDelete, nodePath("node-a", "/heartbeat"), nil, http.StatusMethodNotAllowed},
	} {
		var got [2]int
		var codes [2]string
		for i, c := range clients[tc.who] {
			got[i], codes[i], _ = e.nodeCall(c, tc.method, tc.path, tc.body)
		}
		if got[0] != tc.want || got[1] != got[0] || codes[1] != codes[0] {
			t.Errorf("%s: HTTP/2 %d %q, framed %d %q; want both %d", tc.name, got[0], codes[0], got[1], codes[1], tc.want)
		}
	}
	// A revoked identity is refused on a connection opened before.
	mc := clients["a"][1]
	if st, _, _ := e.nodeCall(mc, http.MethodPost, nodePath("node-a", "/heartbeat"), hb); st != http.StatusOK {
		t.Fatalf("heartbeat before revocation: %d", st)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-a/revoke", nil, nil); st != http.StatusOK && st != http.StatusNoContent {
		t.Fatalf("revoke: %d", st)
	}
	if st, code, _ := e.nodeCall(mc, http.MethodPost, nodePath("node-a", "/heartbeat"), hb); st != http.StatusForbidden {
		t.Fatalf("heartbeat after revocation on the same connection: %d %s, want 403", st, code)
	}
}

// TestNodeMuxLongPoll: a task long-poll parked on the framed connection is
// delivered its task, and long-polls the agent gives up end on the server
// at once, freeing their node's slots (as a reset HTTP/2 stream does).
func TestNodeMuxLongPoll(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.NodeLongPollLimit = 2; c.MaxWait = 30 * time.Second })
	a := e.enroll("node-a", e.createHost("node-a").Token)
	mc := e.muxClient(&a.cert)
	wait := nodePath("node-a", "/tasks/wait?timeout=30s")

	got := make(chan api.TaskDelivery, 1)
	go func() {
		st, _, body := e.nodeCall(mc, http.MethodGet, wait, nil)
		var d api.TaskDelivery
		if st != http.StatusOK || json.Unmarshal(body, &d) != nil {
			t.Errorf("long-poll: %d %s", st, body)
		}
		got <- d
	}()
	e.waitMetric(`drover_node_long_polls{route="tasks"}`, 1, 5*time.Second)
	task := e.enqueue("node-a", "diag.echo", map[string]any{"message": "over mux"})
	select {
	case d := <-got:
		if d.TaskID != task.ID {
			t.Fatalf("delivered %+v, want task %s", d, task.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the parked long-poll was not delivered its task")
	}

	e.cancelledPollsFreeSlots(mc, wait, "tasks")
	if st, code, _ := e.nodeGet(mc, nodePath("node-a", "/tasks/wait?timeout=10ms")); st != http.StatusNoContent {
		t.Fatalf("long-poll after the cancelled ones: %d %s", st, code)
	}
}

// TestNodeMuxDesiredLongPoll: a desired-set long-poll parked on the framed
// connection is answered with the changed set when an instance is placed
// on its node, and long-polls the agent gives up end on the server at
// once, freeing their node's slots.
func TestNodeMuxDesiredLongPoll(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.NodeLongPollLimit = 2; c.VCPUAllocationRatio = 1 })
	n := startAPINode(e, "node-a")
	mc := e.muxClient(&n.id.cert)
	get := func(path string) (int, api.NodeInstances) {
		st, _, body := e.nodeCall(mc, http.MethodGet, path, nil)
		var set api.NodeInstances
		if st == http.StatusOK && json.Unmarshal(body, &set) != nil {
			st = 0
		}
		return st, set
	}
	st, empty := get(nodePath("node-a", "/instances"))
	if st != http.StatusOK || len(empty.Instances) != 0 {
		t.Fatalf("empty set: %d %+v", st, empty)
	}

	got := make(chan api.NodeInstances, 1)
	go func() {
		st, set := get(nodePath("node-a", "/instances?wait=15s&etag="+empty.ETag))
		if st != http.StatusOK {
			t.Errorf("long-poll: %d", st)
		}
		got <- set
	}()
	e.waitMetric(`drover_node_long_polls{route="instances"}`, 1, 5*time.Second)
	in := e.createInstance(api.CreateInstanceRequest{Name: "mux-1", HostID: "node-a", Spec: apiSpec(1, 64)})
	var set api.NodeInstances
	select {
	case set = <-got:
		if set.ETag == empty.ETag || len(set.Instances) != 1 || set.Instances[0].ID != in.ID {
			t.Fatalf("answered %+v, want the set with %s", set, in.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the parked long-poll was not answered the changed set")
	}

	wait := nodePath("node-a", "/instances?wait=15s&etag="+set.ETag)
	e.cancelledPollsFreeSlots(mc, wait, "instances")
	if st, again := get(nodePath("node-a", "/instances?wait=10ms&etag="+set.ETag)); st != http.StatusOK || again.ETag != set.ETag {
		t.Fatalf("long-poll after the cancelled ones: %d %s, want 200 with the same ETag", st, again.ETag)
	}
}

// cancelledPollsFreeSlots holds the node's two long-polls of route (its
// limit) on mc, checks that a third is refused 429 node_long_poll_limit,
// then cancels the two and checks that the server let go of both at once.
func (e *env) cancelledPollsFreeSlots(mc *http.Client, wait, route string) {
	e.t.Helper()
	series := `drover_node_long_polls{route="` + route + `"}`
	polls := []*longPoll{e.startLongPoll(mc, wait), e.startLongPoll(mc, wait)}
	e.waitMetric(series, 2, 5*time.Second)
	if st, code, _ := e.nodeGet(mc, wait); st != http.StatusTooManyRequests || code != "node_long_poll_limit" {
		e.t.Fatalf("third long-poll: %d %s, want 429 node_long_poll_limit", st, code)
	}
	for _, p := range polls {
		p.cancel()
		<-p.done
	}
	e.waitMetric(series, 0, 5*time.Second)
}

// TestExpiredCertificateOnOpenConnection: a connection opened with a valid
// certificate does not keep it valid: once the certificate has expired,
// requests on that same connection are refused 401
// client_certificate_expired, over HTTP/2 and over the framed connection.
func TestExpiredCertificateOnOpenConnection(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.CertTTL = 3 * time.Second })
	n := e.enroll("node-x", e.createHost("node-x").Token)
	hb := api.Heartbeat{AgentVersion: "x"}
	clients := map[string]*http.Client{"HTTP/2": n.client, "framed": e.muxClient(&n.cert)}
	for name, c := range clients {
		if st, code, _ := e.nodeCall(c, http.MethodPost, nodePath("node-x", "/heartbeat"), hb); st != http.StatusOK {
			t.Fatalf("%s before expiry: %d %s", name, st, code)
		}
	}
	time.Sleep(time.Until(n.cert.Leaf.NotAfter) + 200*time.Millisecond)
	for name, c := range clients {
		st, code, _ := e.nodeCall(c, http.MethodPost, nodePath("node-x", "/heartbeat"), hb)
		if st != http.StatusUnauthorized || code != "client_certificate_expired" {
			t.Errorf("%s after expiry, same connection: %d %q, want 401 client_certificate_expired", name, st, code)
		}
	}
}

// TestNodeMuxIdleAgentsHoldNoGoroutine: agents whose framed connections
// each hold a parked task long-poll cost the control plane no goroutine
// (ADR 0019: the connections wait in the epoll poller, the long-polls
// parked without their handlers); a task enqueued meanwhile is delivered
// on one of them, and closing the connections frees every long-poll slot.
func TestNodeMuxIdleAgentsHoldNoGoroutine(t *testing.T) {
	const conns = 30
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.NodeLongPollLimit = conns; c.MaxWait = time.Minute })
	a := e.enroll("node-a", e.createHost("node-a").Token)
	before := testutil.SettledGoroutines()
	cs := make([]*tls.Conn, conns)
	for i := range cs {
		cs[i] = e.muxDial(&a.cert)
		if _, err := cs[i].Write(nodemux.AppendRequest(nil, 1, http.MethodGet, nodePath("node-a", "/tasks/wait?timeout=60s"),
			nil, nil)); err != nil {
			t.Fatal(err)
		}
	}
	e.waitMetric(`drover_node_long_polls{route="tasks"}`, conns, 10*time.Second)
	// Each connection's reading goroutine lingers a second after its frame.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		grew := runtime.NumGoroutine() - before
		if grew < conns/3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines more for %d idle agents with a parked long-poll each, want none per agent", grew, conns)
		}
	}

	task := e.enqueue("node-a", "diag.echo", map[string]any{"message": "to a parked poll"})
	got := make(chan string, conns)
	for _, c := range cs {
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			var hdr [nodemux.HeaderLen]byte
			f, err := nodemux.ReadFrame(c, &hdr, nodemux.MaxPayload)
			if err != nil {
				return
			}
			resp, err := nodemux.ParseResponse(f.Payload)
			var d api.TaskDelivery
			if err == nil && resp.Status == http.StatusOK && json.Unmarshal(resp.Body, &d) == nil {
				got <- d.TaskID
			}
		}()
	}
	select {
	case id := <-got:
		if id != task.ID {
			t.Fatalf("delivered %q, want %s", id, task.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no parked long-poll was delivered the task")
	}
	for _, c := range cs {
		_ = c.Close()
	}
	e.waitMetric(`drover_node_long_polls{route="tasks"}`, 0, 10*time.Second)
}
