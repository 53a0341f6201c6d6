package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cli/preflight"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
	wirepf "github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// The operator's `drover preflight` against a real control plane and a real
// agent: the node-side hops run the real drover-agent binary, locally
// (--node-local) or over a real sshd (preflight_ssh_test.go).

// preflightNode is an enrolled, healthy agent and the environment its
// drover-agent preflight reads.
type preflightNode struct {
	id       string
	stateDir string
	stop     func()
}

func (e *env) preflightNode(id string) *preflightNode {
	e.t.Helper()
	bt := e.createHost(id)
	dir := e.t.TempDir()
	_, stop := e.startAgent(id, bt.Token, agentOpts{stateDir: dir})
	e.waitHostStatus(id, api.HostHealthy, 10*time.Second)
	return &preflightNode{id: id, stateDir: dir, stop: stop}
}

// agentEnv is the agent configuration drover-agent preflight loads.
func (e *env) agentEnv(n *preflightNode) map[string]string {
	return map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": e.nodeURL, "NODE_AGENT_HOST_ID": n.id,
		"NODE_AGENT_STATE_DIR": n.stateDir, "NODE_AGENT_CA_HASH": e.srv.CAHash(), "NODE_AGENT_OS_FAMILY": "linux",
		"NODE_AGENT_RUNTIME": "none"}
}

// runPreflight runs the operator side against e with cfg's node-side
// settings.
func (e *env) runPreflight(cfg preflight.Config) *wirepf.Report {
	e.t.Helper()
	cfg.APIBase, cfg.Token = e.opURL, e.opToken
	if cfg.Timeout == 0 {
		cfg.Timeout = 15 * time.Second
	}
	cfg.Warn = func(s string) { e.t.Errorf("warning: %s", s) }
	cfg.Progress = func(h wirepf.HopResult) { e.t.Logf("%s  %s", preflight.ProgressLine(h), h.Detail) }
	rep, err := preflight.Run(context.Background(), cfg)
	if err != nil {
		e.t.Fatalf("preflight: %v", err)
	}
	return rep
}

func pfHop(rep *wirepf.Report, h signal.Hop) wirepf.HopResult {
	for _, r := range rep.Hops {
		if r.Hop == h {
			return r
		}
	}
	return wirepf.HopResult{}
}

// wantFailedAt checks the classification and that every later hop but the
// last is skipped.
func wantFailedAt(t *testing.T, rep *wirepf.Report, hop signal.Hop, sig signal.Name) {
	t.Helper()
	if c := rep.Classification; c.OK || c.Hop != hop || c.Signal != sig {
		t.Fatalf("classification %+v, want %s at %s; hops:\n%s", c, sig, hop, hopTable(rep))
	}
	after := false
	for _, h := range rep.Hops[:len(rep.Hops)-1] {
		if after && h.Status != wirepf.Skipped {
			t.Errorf("hop %s after the failed hop: %s", h.Hop, h.Status)
		}
		after = after || h.Hop == hop
	}
}

func hopTable(rep *wirepf.Report) string {
	var b strings.Builder
	_ = preflight.WriteTable(&b, rep)
	return b.String()
}

func setEnv(t *testing.T, vars map[string]string) {
	for k, v := range vars {
		t.Setenv(k, v)
	}
}

// TestPreflightHealthy: a real allocation, --node-local and --run-ws-smoke:
// every hop passes (node_ops_access is skipped: no SSH), the session
// reached ready and was closed, and the report is stored under its
// correlation id.
func TestPreflightHealthy(t *testing.T) {
	requireRoot(t)
	bin := buildAgent(t)
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.Terminal.RecordingDir = t.TempDir() })
	n := e.preflightNode("pf-healthy")
	setEnv(t, e.agentEnv(n))
	user := fmt.Sprintf("drvp%d", rand.IntN(1_000_000))
	t.Cleanup(func() { exec.Command("userdel", "-r", user).Run() })
	var a api.Allocation
	if st := e.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: n.id}, &a); st != http.StatusCreated {
		t.Fatalf("create allocation: HTTP %d", st)
	}
	e.waitAllocState(a.ID, api.AllocationActive, 60*time.Second)

	rep := e.runPreflight(preflight.Config{AllocationID: a.ID, NodeLocal: true, AgentBinary: bin, RunWSSmoke: true})
	for _, h := range rep.Hops {
		want := wirepf.Passed
		if h.Hop == signal.HopNodeOpsAccess {
			want = wirepf.Skipped
		}
		if h.Status != want {
			t.Errorf("hop %s: %s, want %s (%s)", h.Hop, h.Status, want, h.Detail)
		}
	}
	if !rep.Classification.OK || rep.NodeID != n.id || rep.SessionID == "" {
		t.Fatalf("report: %+v\n%s", rep.Classification, hopTable(rep))
	}
	s := e.waitSessionClosed(rep.SessionID, 10*time.Second)
	if s.CorrelationID != rep.CorrelationID {
		t.Errorf("session correlation id %q, want the run's %q", s.CorrelationID, rep.CorrelationID)
	}
	task := pfHop(rep, signal.HopNodeRecoveryStatus).Data["task_id"]
	var probe api.Task
	if e.op(http.MethodGet, fmt.Sprintf("/api/v1/tasks/%v", task), nil, &probe); probe.CorrelationID != rep.CorrelationID || probe.State != api.TaskSucceeded {
		t.Errorf("health probe %+v", probe)
	}
	var raw []byte
	if st := e.op(http.MethodGet, "/api/v1/preflight-runs?node_id="+n.id, nil, &raw); st != http.StatusOK || !strings.Contains(string(raw), rep.CorrelationID) {
		t.Errorf("stored runs (HTTP %d) lack %s: %s", st, rep.CorrelationID, raw)
	}
}

// TestPreflightStoppedAgent: an agent that stopped fails node_heartbeat
// with node_agent_heartbeat_stale.
func TestPreflightStoppedAgent(t *testing.T) {
	e := startEnv(t, openSQLite(t), fastLiveness)
	n := e.preflightNode("pf-stopped")
	n.stop()
	e.waitHostStatus(n.id, api.HostStale, 10*time.Second)
	rep := e.runPreflight(preflight.Config{NodeID: n.id, NodeLocal: true, AgentBinary: "/nonexistent"})
	wantFailedAt(t, rep, signal.HopNodeHeartbeat, signal.HeartbeatStale)
}

// TestPreflightWrongTerminalResolve: the node-facing terminal URL dialled
// at an address nothing listens on fails node_terminal_reachability,
// after every earlier hop passed.
func TestPreflightWrongTerminalResolve(t *testing.T) {
	bin := buildAgent(t)
	e := startEnv(t, openSQLite(t))
	n := e.preflightNode("pf-term")
	setEnv(t, e.agentEnv(n))
	rep := e.runPreflight(preflight.Config{NodeID: n.id, NodeLocal: true, AgentBinary: bin,
		NodeTerminalURL: e.nodeURL, NodeTerminalResolveAddress: "127.0.0.2", Timeout: 5 * time.Second})
	wantFailedAt(t, rep, signal.HopNodeTerminalReachability, pfHop(rep, signal.HopNodeTerminalReachability).Signal)
	for _, h := range []signal.Hop{signal.HopNodeReadiness, signal.HopNodeRuntimeAPIReachability, signal.HopNodeRecoveryStatus,
		signal.HopTerminalPublicRoute, signal.HopBrowserTerminalWS} {
		if r := pfHop(rep, h); r.Status != wirepf.Passed {
			t.Errorf("hop %s: %s (%s)", h, r.Status, r.Detail)
		}
	}
	if d := pfHop(rep, signal.HopNodeTerminalReachability).Detail; !strings.Contains(d, "127.0.0.2") {
		t.Errorf("detail %q does not name the resolve address", d)
	}
}

// TestPreflightNoHealthz: a terminal base without /healthz (another server
// that answers 404) fails terminal_public_route.
func TestPreflightNoHealthz(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := e.preflightNode("pf-route")
	edge := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(edge.Close)
	rep := e.runPreflight(preflight.Config{NodeID: n.id, TerminalBase: edge.URL})
	wantFailedAt(t, rep, signal.HopTerminalPublicRoute, signal.PublicRouteMissing)
	if d := pfHop(rep, signal.HopTerminalPublicRoute).Detail; !strings.Contains(d, "HTTP 404") || !strings.Contains(d, "/healthz") {
		t.Errorf("detail %q", d)
	}
	if r := pfHop(rep, signal.HopNodeReadiness); r.Status != wirepf.Skipped || !strings.Contains(r.Detail, "--node-host") {
		t.Errorf("node_readiness without a node path: %+v", r)
	}
}
