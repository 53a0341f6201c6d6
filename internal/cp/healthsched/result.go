package healthsched

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/drover-dev/drover/internal/cp/hosts"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Subscribe applies every finished diag.health_probe, scheduled or run by
// an operator, to its host's health.
func (s *Scheduler) Subscribe(b *taskbus.Bus) {
	b.OnFinished(task.TypeHealthProbe, s.probeDone)
}

// probeOutput is the part of diag.health_probe's output (the agent's
// internal/node/diag report) health is made of.
type probeOutput struct {
	Healthy *bool `json:"healthy"`
	Checks  []struct {
		Name   string `json:"name"`
		OK     bool   `json:"ok"`
		Reason string `json:"reason"`
		Detail string `json:"detail"`
	} `json:"checks"`
}

// Outcome is what a finished diag.health_probe says about its host: a
// succeeded probe's report is healthy or unhealthy (the summary names the
// failed checks); a probe that failed or expired says unknown. ok is false
// for a task that says nothing (canceled).
func Outcome(e taskbus.Finished) (o hosts.HealthOutcome, ok bool) {
	t := e.Task
	o = hosts.HealthOutcome{HostID: t.NodeID, TaskID: t.ID, CorrelationID: t.CorrelationID, At: t.FinishedAt}
	switch t.State {
	case api.TaskSucceeded:
		var out probeOutput
		if e.Result == nil || json.Unmarshal(e.Result.Output, &out) != nil || out.Healthy == nil {
			o.Health, o.Summary = api.HealthUnknown, "diag.health_probe succeeded without a health report"
			return o, true
		}
		var failed []string
		for _, c := range out.Checks {
			if !c.OK {
				f := c.Name + ": " + c.Reason
				if c.Detail != "" {
					f += " (" + c.Detail + ")"
				}
				failed = append(failed, f)
			}
		}
		switch {
		case *out.Healthy:
			o.Health, o.Summary = api.HealthHealthy, fmt.Sprintf("%d/%d checks ok", len(out.Checks), len(out.Checks))
		case len(failed) == 0:
			o.Health, o.Summary = api.HealthUnhealthy, "the probe reports unhealthy"
		default:
			o.Health, o.Summary = api.HealthUnhealthy, strings.Join(failed, "; ")
		}
	case api.TaskFailed:
		o.Health, o.Summary = api.HealthUnknown, "diag.health_probe failed"
		if e.Result != nil && e.Result.Error != nil {
			o.Summary += ": " + e.Result.Error.Code + ": " + e.Result.Error.Message
		}
	case api.TaskExpired:
		o.Health, o.Summary = api.HealthUnknown, "diag.health_probe expired without a result"
	default:
		return o, false
	}
	return o, true
}

// probeDone records a finished probe on its host.
func (s *Scheduler) probeDone(ctx context.Context, e taskbus.Finished) {
	o, ok := Outcome(e)
	if !ok {
		return
	}
	if o.At.IsZero() {
		o.At = s.cfg.Now().UTC()
	}
	if err := s.hosts.RecordHealth(ctx, o); err != nil && ctx.Err() == nil {
		s.log.Warn("record host health", "host_id", o.HostID, "task_id", o.TaskID, "correlation_id", o.CorrelationID, "err", err)
	}
}
