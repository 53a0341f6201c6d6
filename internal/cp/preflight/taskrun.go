package preflight

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Subscribe stores the report of every diag.preflight task that succeeds
// as a preflight run of its host.
func (s *Room) Subscribe(b *taskbus.Bus) {
	b.OnFinished(task.TypePreflight, s.preflightTaskDone)
}

// TaskRunID is the id of the preflight run a diag.preflight task's report
// is stored under: one run per task, so the same result posted twice
// stores nothing new.
func TaskRunID(taskID string) string { return "pfr_" + strings.TrimPrefix(taskID, "tsk_") }

// preflightTaskDone stores a succeeded diag.preflight task's report as a
// preflight run: the host is the task's node (the node that posted the
// result over mTLS, whatever the report says), the correlation id the
// task's, and the run is created by whoever queued the task. A task that
// failed or expired measured nothing and stores nothing; a report that
// does not validate is logged and dropped.
func (s *Room) preflightTaskDone(ctx context.Context, e taskbus.Finished) {
	t := e.Task
	if t.State != api.TaskSucceeded || e.Result == nil {
		return
	}
	log := s.cfg.Log.With("task_id", t.ID, "host_id", t.NodeID, "correlation_id", t.CorrelationID)
	var rep preflight.Report
	if err := json.Unmarshal(e.Result.Output, &rep); err != nil {
		log.Warn("diag.preflight result is not a preflight report", "err", err)
		return
	}
	rep.NodeID = t.NodeID
	if t.CorrelationID != "" {
		rep.CorrelationID = t.CorrelationID
	}
	if fields := Validate(rep); len(fields) > 0 {
		log.Warn("diag.preflight report refused", "fields", fields)
		return
	}
	if rep.CorrelationID == "" {
		rep.CorrelationID = TaskRunID(t.ID)
	}
	if _, err := s.record(ctx, TaskRunID(t.ID), rep, orSystem(t.CreatedBy)); err != nil && !errors.Is(err, store.ErrConflict) {
		log.Warn("store diag.preflight report", "err", err)
	}
}

func orSystem(actor string) string {
	if actor == "" {
		return "system"
	}
	return actor
}
