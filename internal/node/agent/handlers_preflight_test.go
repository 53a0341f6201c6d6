package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestPreflightHandler: diag.preflight runs the node-side preflight hops of
// an enrolled agent and answers a preflight.Report under the task's
// correlation id (all pass against the fake control plane and gateway); a
// broken terminal URL is a failed hop in a succeeded task; bad params fail
// the task with invalid_params.
func TestPreflightHandler(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	dir := t.TempDir()
	startAgent(t, f, dir, (&counter{}).handlers()).stop(t)
	cfg := testConfig(f, dir)
	cfg.TerminalURL = terminalGateway(t, f)
	clock := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	h := agent.PreflightHandler(cfg, func() time.Time { return clock })
	if h.Timeout != task.PreflightTimeout {
		t.Errorf("timeout %s", h.Timeout)
	}
	run := func(params string) preflight.Report {
		t.Helper()
		out, err := h.Run(context.Background(), agent.Task{ID: "tsk_pf", Type: task.TypePreflight, CorrelationID: "cid-pf",
			Params: json.RawMessage(params)})
		if err != nil {
			t.Fatalf("run %s: %v", params, err)
		}
		// The output goes over the wire as JSON; decode it as the control
		// plane does.
		b, err := json.Marshal(out.Output)
		if err != nil {
			t.Fatal(err)
		}
		var rep preflight.Report
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		if len(out.Timings) != 3 || out.Timings[string(signal.HopNodeTerminalReachability)+"_ms"] < 0 {
			t.Errorf("timings %v", out.Timings)
		}
		return rep
	}
	rep := run(`{"hop_timeout_seconds":5}`)
	if rep.Schema != preflight.SchemaVersion || rep.CorrelationID != "cid-pf" || rep.NodeID != testNodeID ||
		!rep.StartedAt.Equal(clock) || rep.Inputs["task_id"] != "tsk_pf" || rep.Inputs["source"] != task.TypePreflight {
		t.Errorf("report header %+v", rep)
	}
	if len(rep.Hops) != 3 || !rep.Classification.OK {
		t.Fatalf("hops %+v classification %+v", rep.Hops, rep.Classification)
	}
	for i, want := range []signal.Hop{signal.HopNodeReadiness, signal.HopNodeRuntimeAPIReachability, signal.HopNodeTerminalReachability} {
		if rep.Hops[i].Hop != want || rep.Hops[i].Status != preflight.Passed {
			t.Errorf("hop %d: %+v", i, rep.Hops[i])
		}
	}

	cfg.TerminalURL = "https://" + closedAddr(t)
	h = agent.PreflightHandler(cfg, time.Now)
	rep = run(`{}`)
	if c := rep.Classification; c.OK || c.Hop != signal.HopNodeTerminalReachability || c.Signal != signal.NodeStreamTimeout {
		t.Errorf("closed terminal port: classification %+v", c)
	}

	_, err := h.Run(context.Background(), agent.Task{ID: "tsk_bad", Type: task.TypePreflight, Params: json.RawMessage(`{"hop_timeout_seconds":60}`)})
	var he *agent.HandlerError
	if !errors.As(err, &he) || he.Code != "invalid_params" {
		t.Errorf("bad params: %v", err)
	}
}
