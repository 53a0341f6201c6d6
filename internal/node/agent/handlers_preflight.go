package agent

import (
	"context"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/task"
)

// PreflightHandler runs diag.preflight: the node-side preflight hops that
// `drover-agent preflight` runs (Preflight, with cfg's identity and URLs),
// answered as a preflight.Report under the task's correlation id; the
// control plane stores it as a preflight run of this host. A failed hop is
// a succeeded task whose report says so (the run is the result); only bad
// params fail the task.
func PreflightHandler(cfg Config, now func() time.Time) Handler {
	return Handler{Timeout: task.PreflightTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
		p, fe := task.DecodePreflightParams(t.Params)
		if fe != nil {
			return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
		}
		start := now().UTC()
		nr := Preflight(ctx, cfg, PreflightOptions{Timeout: time.Duration(p.HopTimeoutSeconds) * time.Second})
		rep := preflight.Report{Schema: nr.Schema, CorrelationID: t.CorrelationID, StartedAt: start,
			FinishedAt: now().UTC(), NodeID: nr.NodeID, Hops: nr.Hops,
			Inputs: map[string]string{"source": task.TypePreflight, "task_id": t.ID, "agent_version": nr.AgentVersion,
				"goos": nr.GOOS, "goarch": nr.GOARCH}}
		rep.Classify()
		timings := make(map[string]int64, len(rep.Hops))
		for _, h := range rep.Hops {
			timings[string(h.Hop)+"_ms"] = h.DurationMS
		}
		return Outcome{Output: rep, Timings: timings}, nil
	}}
}
