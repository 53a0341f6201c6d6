package allocations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/periodic"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// SweepInterval is how often the control plane sweeps the host
// allocations that wait for a user task.
const SweepInterval = time.Minute

// sweepGrace is how long after its last write an allocation whose user
// task is not in the store is left alone: Create and Release write the
// allocation first and queue its task next, so a sweep between the two
// writes must not take the task for lost.
const sweepGrace = 5 * time.Minute

// settle moves a host allocation on when its user task t finished:
// provision succeeded → active, otherwise failed; deprovision succeeded →
// released, otherwise it stays releasing with the reason, for an operator
// to release it again (Release queues the deprovision again). A task that
// is not the allocation's current one changes nothing.
func (s *Room) settle(ctx context.Context, allocationID string, t store.Task, res *api.TaskResult) {
	reason := ""
	if t.State != api.TaskSucceeded {
		reason = string(t.State)
		if res != nil && res.Error != nil {
			reason = res.Error.Code + ": " + res.Error.Message
		}
	}
	_, err := s.store.UpdateAllocationAudited(ctx, allocationID, func(a *store.Allocation) error {
		switch {
		case t.Type == task.TypeAllocProvisionUser && t.ID == a.ProvisionTaskID && a.State == api.AllocationProvisioning:
			a.State, a.StateReason = api.AllocationActive, ""
			if reason != "" {
				a.State, a.StateReason = api.AllocationFailed, reason
			}
		case t.Type == task.TypeAllocDeprovisionUser && t.ID == a.ReleaseTaskID && a.State == api.AllocationReleasing &&
			(reason == "" || a.StateReason != reason):
			a.State, a.StateReason = api.AllocationReleased, ""
			if reason != "" {
				a.State, a.StateReason = api.AllocationReleasing, reason
			}
		default:
			return errNoChange
		}
		a.UpdatedAt = s.now().UTC()
		return nil
	}, func(a store.Allocation) []store.AuditEvent {
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: "system", Action: "allocation.state", Target: a.ID,
			Result: string(a.State), CID: t.CorrelationID, Detail: "task=" + t.ID + " " + reason})}
	})
	if err != nil && !errors.Is(err, errNoChange) {
		s.log.Warn("allocation task result", "allocation_id", allocationID, "task_id", t.ID, "err", err,
			"correlation_id", t.CorrelationID)
	}
}

// retryRelease says why a releasing host allocation's deprovision is to be
// queued again ("" when it is not): its task failed, expired or was
// canceled, or is not in the store (a control plane that stopped between
// the allocation's write and the task's).
func (s *Room) retryRelease(ctx context.Context, a store.Allocation) (string, error) {
	if a.InstanceID != "" || isSlice(a) {
		return "", nil
	}
	t, err := s.store.GetTask(ctx, a.ReleaseTaskID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Sprintf("task %s is not in the store", a.ReleaseTaskID), nil
	case err != nil:
		return "", fmt.Errorf("release %s: read its task %s: %w", a.ID, a.ReleaseTaskID, err)
	case t.State.Terminal() && t.State != api.TaskSucceeded:
		return fmt.Sprintf("task %s %s", t.ID, t.State), nil
	}
	return "", nil
}

// Sweep heals the host allocations that wait for a user task:
//   - one whose task finished without its result reaching the room (a
//     control plane that stopped between the result and its handling)
//     settles as the result says;
//   - one whose task is not in the store (a control plane that stopped
//     between the allocation's write and its task's) fails when it was
//     provisioning (no user was made), and queues its deprovision again
//     when it was releasing: the user must go.
//
// A failed deprovision is not retried here: the operator releases again.
func (s *Room) Sweep(ctx context.Context) error {
	var errs []error
	for _, state := range []api.AllocationState{api.AllocationProvisioning, api.AllocationReleasing} {
		as, err := s.store.ListAllocations(ctx, store.AllocationFilter{State: state})
		if err != nil {
			errs = append(errs, fmt.Errorf("allocations: sweep: %w", err))
			continue
		}
		for _, a := range as {
			if a.InstanceID != "" || isSlice(a) {
				continue
			}
			if err := s.heal(ctx, a); err != nil {
				errs = append(errs, fmt.Errorf("allocations: sweep %s: %w", a.ID, err))
			}
		}
	}
	return errors.Join(errs...)
}

// RunSweeper sweeps every interval until ctx ends.
func (s *Room) RunSweeper(ctx context.Context, interval time.Duration) {
	periodic.Run(ctx, interval, s.log, "sweep allocations", s.Sweep)
}

// heal is Sweep for one allocation.
func (s *Room) heal(ctx context.Context, a store.Allocation) error {
	taskID := a.ProvisionTaskID
	if a.State == api.AllocationReleasing {
		taskID = a.ReleaseTaskID
	}
	t, err := s.store.GetTask(ctx, taskID)
	switch {
	case err == nil && t.State.Terminal():
		var res *api.TaskResult
		if len(t.Result) > 0 {
			res = new(api.TaskResult)
			if json.Unmarshal(t.Result, res) != nil {
				res = nil
			}
		}
		s.settle(ctx, a.ID, t, res)
		return nil
	case err == nil: // still queued or running
		return nil
	case !errors.Is(err, store.ErrNotFound):
		return err
	case s.now().Sub(a.UpdatedAt) < sweepGrace:
		return nil
	}
	ctx = httpapi.Correlated(ctx, nil, http.Header{}) // a correlation id of its own
	lost := fmt.Sprintf("task %s is not in the store", taskID)
	var next store.Task
	_, err = s.store.UpdateAllocationAudited(ctx, a.ID, func(cur *store.Allocation) error {
		switch {
		case cur.State == api.AllocationProvisioning && cur.ProvisionTaskID == taskID:
			cur.State, cur.StateReason = api.AllocationFailed, task.TypeAllocProvisionUser+" "+lost+": it was never queued"
		case cur.State == api.AllocationReleasing && cur.ReleaseTaskID == taskID:
			next = s.deprovisionTask(ctx, cur)
			cur.StateReason, cur.ReleaseTaskID = "", next.ID
		default:
			return errNoChange // moved on meanwhile
		}
		cur.UpdatedAt = s.now().UTC()
		return nil
	}, func(out store.Allocation) []store.AuditEvent {
		entry := audit.Entry{Actor: "system", Action: "allocation.state", Target: a.ID, Result: string(out.State),
			CID: httpapi.CorrelationID(ctx), Detail: out.StateReason}
		if next.ID != "" {
			entry.Action, entry.Detail = "allocation.release", "retry: "+lost
		}
		return []store.AuditEvent{s.audit.Event(ctx, entry)}
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	if err != nil {
		return err
	}
	if next.ID != "" {
		return s.tasks.Enqueue(ctx, next)
	}
	return nil
}
