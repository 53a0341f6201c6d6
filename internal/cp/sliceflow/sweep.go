package sliceflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/periodic"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// StuckAfter is how long an await step (await_provision, await_release
// and its compensating twin) waits for its task's result before the
// workflow stops waiting. It is past the task's own expiry (taskTTL), so
// it only ends waits the reaper's expiry event did not: a task gone from
// the store, an event lost with a control plane that then ran for longer
// than the expiry, a reaper that could not run.
const StuckAfter = taskTTL + 5*time.Minute

// SweepInterval is how often the control plane sweeps the workflows.
const SweepInterval = time.Minute

// Sweep advances every workflow not finished once: one whose awaited task
// finished without its event reaching this replica goes on, and one whose
// await step has waited past StuckAfter stops waiting (await_provision
// fails with signal slice_workflow_stuck and compensates; an await_release
// records that the release never answered and frees the leases).
func (s *Room) Sweep(ctx context.Context) error {
	ws, err := s.store.ListSliceWorkflows(ctx, true)
	if err != nil {
		return fmt.Errorf("sliceflow: sweep: %w", err)
	}
	var errs []error
	for _, w := range ws {
		if err := s.Advance(ctx, w.AllocationID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RunSweeper sweeps every interval until ctx ends.
func (s *Room) RunSweeper(ctx context.Context, interval time.Duration) {
	periodic.Run(ctx, interval, s.log, "sweep slice workflows", s.Sweep)
}

// overdue says whether an await step that has no result yet has waited
// past the bound, with the detail to record.
func (s *Room) overdue(rec *store.SliceStep, typ, taskID string) (string, bool) {
	waited := s.now().UTC().Sub(rec.StartedAt)
	if waited <= s.stuckAfter {
		return "", false
	}
	return fmt.Sprintf("%s %s has had no result for %s (bound %s): the node never answered and the task did not expire",
		typ, taskID, waited.Round(time.Second), s.stuckAfter), true
}

// missing is an await step's outcome for a task gone from the store.
func missing(typ, taskID string) outcome {
	return outcome{kind: fail, signal: signal.SliceWorkflowStuck,
		detail: fmt.Sprintf("%s %s is not in the store: its result can never come", typ, taskID)}
}
