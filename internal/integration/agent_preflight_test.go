package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/wire/api"
	wirepf "github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// TestAgentPreflightCommand: `drover-agent preflight` (in process) on an
// enrolled node against a real control plane: the runtime API hop reaches
// the node API's JWKS route with the node certificate and the terminal hop
// gets the real gateway's 404 terminal_session_unknown for a made-up
// session. With the runtime API address pointed at a closed port, the hop
// fails with node_agent_api_unreachable and the exit code is 1.
func TestAgentPreflightCommand(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	const id = "agent-preflight-1"
	bt := e.createHost(id)
	dir := t.TempDir()
	e.startAgent(id, bt.Token, agentOpts{stateDir: dir})
	e.waitHostStatus(id, api.HostHealthy, 10*time.Second)
	vars := map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": e.nodeURL, "NODE_AGENT_HOST_ID": id,
		"NODE_AGENT_STATE_DIR": dir, "NODE_AGENT_CA_HASH": e.srv.CAHash(), "NODE_AGENT_OS_FAMILY": "linux",
		"NODE_AGENT_RUNTIME": "none"}
	getenv := func(k string) string { return vars[k] }

	var out, progress bytes.Buffer
	code := agent.PreflightCommand(context.Background(), []string{"--json", "--timeout", "10s"}, getenv, nil, &out, &progress)
	var rep wirepf.NodeReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
	if code != 0 || len(rep.Hops) != 3 || rep.NodeID != id {
		t.Fatalf("exit %d, report %s\nprogress:\n%s", code, out.String(), progress.String())
	}
	for _, h := range rep.Hops {
		if h.Status != wirepf.Passed {
			t.Errorf("hop %s: %s %s %s", h.Hop, h.Status, h.Signal, h.Detail)
		}
	}
	if d := rep.Hops[2].Detail; !strings.Contains(d, "terminal_session_unknown") {
		t.Errorf("terminal hop detail %q: want the gateway's session-unknown answer", d)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	out.Reset()
	code = agent.PreflightCommand(context.Background(), []string{"--json", "--runtime-resolve-address", closed}, getenv, nil, &out, &progress)
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if h := rep.Hops[1]; code != 1 || h.Status != wirepf.Failed || h.Signal != signal.APIUnreachable || !strings.Contains(h.Detail, "refused") {
		t.Errorf("exit %d, runtime hop %+v", code, h)
	}
}
