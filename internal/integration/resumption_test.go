package integration

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
)

// resumingNode is a node identity whose client keeps TLS session tickets,
// as the real agent does for its current certificate.
type resumingNode struct {
	id     string
	client *http.Client
}

func (e *env) resumingNode(n nodeIdentity) *resumingNode {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.srv.CAPEM())
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{n.cert},
		ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	return &resumingNode{id: n.id, client: &http.Client{Timeout: 20 * time.Second,
		Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}}
}

// heartbeat sends a heartbeat to nodeURL on a new connection; it returns
// the status (0: the connection failed), the error code and whether the
// TLS session was resumed.
func (n *resumingNode) heartbeat(t *testing.T, nodeURL string) (status int, code string, resumed bool) {
	t.Helper()
	n.client.CloseIdleConnections()
	b, _ := json.Marshal(api.Heartbeat{})
	resp, err := n.client.Post(nodeURL+nodePath(n.id, "/heartbeat"), "application/json", strings.NewReader(string(b)))
	if err != nil {
		return 0, err.Error(), false
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var eb api.ErrorBody
	_ = json.Unmarshal(raw, &eb)
	return resp.StatusCode, eb.Error.Code, resp.TLS != nil && resp.TLS.DidResume
}

// handshakes reads drover_node_tls_handshakes_total{result} from a
// replica's metrics.
func (e *env) handshakes(result string) int {
	e.t.Helper()
	m := regexp.MustCompile(`(?m)^drover_node_tls_handshakes_total\{result="` + result + `"\} (\d+)$`).
		FindStringSubmatch(e.metrics())
	if m == nil {
		return 0
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

// TestSessionResumptionAcrossRestartAndReplicas: an agent's TLS session
// survives a control-plane restart and moves to another replica (their
// ticket keys come from the shared CA), so a reconnect skips the
// certificate work of a full handshake. A resumed session is still a node
// identity like any other: revocation and a later enrolment refuse it per
// request, and an expired certificate is not brought back by its ticket.
func TestSessionResumptionAcrossRestartAndReplicas(t *testing.T) {
	st := openSQLite(t)
	e := startEnv(t, st)
	n := e.resumingNode(e.enroll("node-res", e.createHost("node-res").Token))
	clone := e.resumingNode(e.enroll("node-sup", e.createHost("node-sup").Token))
	for _, c := range []*resumingNode{n, clone} {
		if st, code, resumed := c.heartbeat(t, e.nodeURL); st != http.StatusOK || resumed {
			t.Fatalf("%s: first heartbeat: %d %s resumed=%v, want 200 on a full handshake", c.id, st, code, resumed)
		}
	}

	// Restart on the same addresses: the new process opens the old tickets.
	opAddr, nodeAddr := strings.TrimPrefix(e.opURL, "http://"), strings.TrimPrefix(e.nodeURL, "https://")
	e.stop()
	e.stop = nil
	e = startEnvAt(t, st, opAddr, nodeAddr)
	if st, code, resumed := n.heartbeat(t, e.nodeURL); st != http.StatusOK || !resumed {
		t.Fatalf("after a restart: %d %s resumed=%v, want 200 on a resumed session", st, code, resumed)
	}
	if got := e.handshakes("resumed"); got != 1 {
		t.Errorf("drover_node_tls_handshakes_total{result=\"resumed\"} = %d, want 1", got)
	}

	// Another replica on the same store.
	other := startEnv(t, st)
	if st, code, resumed := n.heartbeat(t, other.nodeURL); st != http.StatusOK || !resumed {
		t.Fatalf("on another replica: %d %s resumed=%v, want 200 on a resumed session", st, code, resumed)
	}

	// A later enrolment supersedes the clone's certificate, resumed or not.
	var bt api.BootstrapToken
	e.op(http.MethodPost, "/api/v1/hosts/node-sup/rotate-token", nil, &bt)
	time.Sleep(1100 * time.Millisecond) // certificates carry second precision
	e.enroll("node-sup", bt.Token)
	if st, code, resumed := clone.heartbeat(t, e.nodeURL); st != http.StatusForbidden || code != "node_identity_superseded" || !resumed {
		t.Fatalf("superseded identity on a resumed session: %d %s resumed=%v, want 403 node_identity_superseded", st, code, resumed)
	}

	// Revocation refuses the resumed session at its first request.
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-res/revoke", nil, nil); st != http.StatusOK {
		t.Fatalf("revoke: %d", st)
	}
	if st, code, resumed := n.heartbeat(t, e.nodeURL); st != http.StatusForbidden || code != "node_identity_revoked" || !resumed {
		t.Fatalf("revoked identity on a resumed session: %d %s resumed=%v, want 403 node_identity_revoked", st, code, resumed)
	}
}

// TestSessionResumptionNotPastCertificateExpiry: once the client
// certificate of a session has expired, its ticket no longer resumes, and
// the full handshake that follows refuses the certificate.
func TestSessionResumptionNotPastCertificateExpiry(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.CertTTL = 2 * time.Second })
	id := e.enroll("node-exp", e.createHost("node-exp").Token)
	n := e.resumingNode(id)
	if st, code, _ := n.heartbeat(t, e.nodeURL); st != http.StatusOK {
		t.Fatalf("first heartbeat: %d %s", st, code)
	}
	if st, code, resumed := n.heartbeat(t, e.nodeURL); st != http.StatusOK || !resumed {
		t.Fatalf("second heartbeat: %d %s resumed=%v, want a resumed session", st, code, resumed)
	}
	time.Sleep(time.Until(id.cert.Leaf.NotAfter) + 1100*time.Millisecond)
	resumedBefore := e.handshakes("resumed")
	if st, code, resumed := n.heartbeat(t, e.nodeURL); st != 0 || resumed {
		t.Fatalf("after the certificate expired: %d %s resumed=%v, want the handshake refused", st, code, resumed)
	}
	if got := e.handshakes("resumed"); got != resumedBefore {
		t.Errorf("resumed handshakes went from %d to %d after the certificate expired", resumedBefore, got)
	}
	if e.handshakes("failed") == 0 {
		t.Error("the refused handshake is not counted as failed")
	}
}

// TestAgentResumesAfterRestart: the real agent's client resumes its
// session when the control plane comes back after a restart.
func TestAgentResumesAfterRestart(t *testing.T) {
	st := openSQLite(t)
	e := startEnv(t, st)
	e.startAgent("node-ar", e.createHost("node-ar").Token, agentOpts{})
	e.waitHostStatus("node-ar", api.HostHealthy, 20*time.Second)
	opAddr, nodeAddr := strings.TrimPrefix(e.opURL, "http://"), strings.TrimPrefix(e.nodeURL, "https://")
	e.stop()
	e.stop = nil
	e = startEnvAt(t, st, opAddr, nodeAddr)
	deadline := time.Now().Add(30 * time.Second)
	for e.handshakes("resumed") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not resume a session within 30s: full %d, failed %d",
				e.handshakes("full"), e.handshakes("failed"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if full := e.handshakes("full"); full != 0 {
		t.Errorf("%d full handshakes after the restart, want every reconnect of the agent resumed", full)
	}
}
