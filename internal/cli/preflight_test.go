package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// TestPreflightCommand: usage errors exit 2; a run against a real control
// plane with an unknown host fails at node_heartbeat (exit 1), prints one
// progress line per hop on stderr and the JSON report on stdout.
func TestPreflightCommand(t *testing.T) {
	apiURL, token := startServer(t)
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append([]string{"preflight", "--token", token}, args...), &Env{Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	for _, args := range [][]string{
		{"--api-base", apiURL}, // no node, no allocation
		{"--api-base", apiURL, "--node-id", "n", "--run-ws-smoke"},                   // smoke without allocation
		{"--api-base", apiURL, "--node-id", "n", "--node-local", "--node-host", "h"}, // both node modes
		{"--api-base", "ftp://x", "--node-id", "n"},
		{"--api-base", apiURL, "--node-id", "n", "--timeout", "bogus"},
	} {
		if code, _, errOut := run(args...); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut)
		}
	}
	code, out, errOut := run("--api", "http://127.0.0.1:1", "--api-base", apiURL, "--node-id", "ghost", "--json", "--timeout", "3s")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s\n%s", code, out, errOut)
	}
	var rep preflight.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("stdout is not a report: %v\n%s", err, out)
	}
	if rep.Schema != "drover.preflight/v1" || rep.Classification.Hop != signal.HopNodeHeartbeat ||
		rep.Classification.Signal != signal.HeartbeatStale || rep.CorrelationID == "" {
		t.Errorf("report %+v", rep.Classification)
	}
	if n := strings.Count(errOut, "preflight ["); n != len(signal.Hops()) {
		t.Errorf("%d progress lines, want %d:\n%s", n, len(signal.Hops()), errOut)
	}
	if !strings.Contains(errOut, "preflight failed at hop node_heartbeat") {
		t.Errorf("stderr %s", errOut)
	}
	code, out, _ = run("--api-base", apiURL, "--node-id", "ghost")
	if code != 1 || !strings.Contains(out, "result: failed at node_heartbeat: node_agent_heartbeat_stale") ||
		!strings.Contains(out, "HOP") {
		t.Errorf("table (exit %d):\n%s", code, out)
	}
}
