// Package sliceflow is the slice allocations' provisioning workflow: it
// takes a slice allocation (api.AllocationSlice) from its request to a
// running VM and back. Provisioning runs lease_slots → vm_provision →
// await_provision → record_result → provision_user (the user inside the
// guest) → activate; a failing step runs the compensating steps
// (compensate_deprovision_user → compensate_release_vm →
// compensate_await_release → compensate_free_leases) and leaves the
// allocation failed with the step, the signal and the correlation id; a
// release runs release_vm → await_release → free_leases.
//
// The workflow is durable: each step is recorded in the store under its
// idempotency key (allocation id + "/" + step) before its side effect, and
// every side effect is idempotent given that record (leases held by the
// allocation count as its own, a task's id is recorded before it is
// queued). A control plane that restarts, or another replica on the same
// PostgreSQL, resumes the workflows not finished (Resume) from their last
// recorded step. Task results reach the workflow by task event
// (taskbus.Finished of slice.vm_provision, slice.vm_release and the
// workflow's allocation.provision_user/deprovision_user), never by polling. It must not import the node side (internal/node).
package sliceflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Store is what the workflow reads and writes. store.Store satisfies it.
type Store interface {
	store.SliceFlowStore
	GetAllocation(ctx context.Context, id string) (store.Allocation, error)
	UpdateAllocationAudited(ctx context.Context, id string, fn func(*store.Allocation) error,
		audit func(store.Allocation) []store.AuditEvent) (store.Allocation, error)
	GetHost(ctx context.Context, id string) (store.Host, error)
	ListHosts(ctx context.Context) ([]store.Host, error)
	ListSlots(ctx context.Context, hostID string) ([]store.Slot, error)
	GetTask(ctx context.Context, id string) (store.Task, error)
	ListTaskEvents(ctx context.Context, taskID string) ([]store.TaskEvent, error)
}

// Tasks builds and queues the slice tasks (the tasks room).
type Tasks interface {
	NewTask(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task
	// Enqueue stores t and wakes its node; store.ErrConflict if a task
	// with t's id exists.
	Enqueue(ctx context.Context, t store.Task) error
}

// Room runs the slice workflows.
type Room struct {
	store Store
	tasks Tasks
	audit *audit.Log
	log   *slog.Logger
	now   func() time.Time

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per allocation: one advance at a time on this replica

	// stuckAfter bounds an await step's wait (StuckAfter).
	stuckAfter time.Duration

	// hook, in tests, runs at each step boundary ("begin:<step>" after the
	// step is recorded, "done:<step>" after it is recorded done); an error
	// stops the advance there, as a crash would.
	hook func(point string) error
}

// New is the slice workflow room.
func New(st Store, tasks Tasks, auditLog *audit.Log, log *slog.Logger, now func() time.Time) *Room {
	return &Room{store: st, tasks: tasks, audit: auditLog, log: log, now: now, locks: map[string]*sync.Mutex{},
		stuckAfter: StuckAfter}
}

// taskTTL is how long a slice task may take from queueing to its result
// before the reaper expires it (which ends the await step).
const taskTTL = task.VMProvisionTimeout + 10*time.Minute

// Subscribe makes the results of slice.vm_provision, slice.vm_release
// and the guest user tasks (allocation.provision_user and
// deprovision_user with vm_name) advance the workflow they belong to.
func (s *Room) Subscribe(b *taskbus.Bus) {
	b.OnFinished(task.TypeVMProvision, s.taskDone)
	b.OnFinished(task.TypeVMRelease, s.taskDone)
	b.OnFinished(task.TypeAllocProvisionUser, s.taskDone)
	b.OnFinished(task.TypeAllocDeprovisionUser, s.taskDone)
}

func (s *Room) taskDone(ctx context.Context, e taskbus.Finished) {
	var p struct {
		AllocationID string `json:"allocation_id"`
	}
	if json.Unmarshal(e.Task.Params, &p) != nil || p.AllocationID == "" {
		return
	}
	w, err := s.store.GetSliceWorkflow(ctx, p.AllocationID)
	if err != nil || !s.ownsTask(ctx, w, e.Task.ID) {
		return // not a workflow's task (an operator ran it by hand, a host allocation's user task)
	}
	if err := s.Advance(context.WithoutCancel(ctx), p.AllocationID); err != nil {
		s.log.Warn("slice workflow", "allocation_id", p.AllocationID, "task_id", e.Task.ID, "err", err,
			"correlation_id", w.CorrelationID)
	}
}

// Resume continues every workflow not finished: run it when the control
// plane starts (and on a replica taking over).
func (s *Room) Resume(ctx context.Context) error {
	ws, err := s.store.ListSliceWorkflows(ctx, true)
	if err != nil {
		return fmt.Errorf("sliceflow: resume: %w", err)
	}
	var errs []error
	for _, w := range ws {
		if err := s.Advance(ctx, w.AllocationID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Start records the workflow of a slice allocation just created (its
// Spec the create request) and runs it as far as it goes without waiting.
func (s *Room) Start(ctx context.Context, a store.Allocation) error {
	now := s.now().UTC()
	w := store.SliceWorkflow{AllocationID: a.ID, HostID: a.HostID, Status: store.SliceFlowProvisioning,
		Spec: a.Spec, CorrelationID: cidOf(ctx, a.ID), CreatedAt: now, UpdatedAt: now}
	if err := s.store.CreateSliceWorkflow(ctx, w); err != nil && !errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("sliceflow %s (correlation_id %s): start: %w", a.ID, w.CorrelationID, err)
	}
	s.audit.Record(ctx, audit.Entry{Actor: orSystem(a.CreatedBy), Action: "slice.workflow.start", Target: a.ID,
		Result: string(store.SliceFlowProvisioning), CID: w.CorrelationID, Detail: "host=" + a.HostID})
	return s.Advance(ctx, a.ID)
}

// Release asks a slice allocation's workflow to release it: an active VM
// is released at once; a workflow still provisioning finishes the step it
// awaits and then releases; a failed one (already compensated) is simply
// released. Releasing twice is fine. It returns the allocation.
func (s *Room) Release(ctx context.Context, id string) (store.Allocation, error) {
	w, err := s.store.UpdateSliceWorkflow(ctx, id, func(w *store.SliceWorkflow) error {
		switch w.Status {
		case store.SliceFlowActive:
			w.Status = store.SliceFlowReleasing
		case store.SliceFlowFailed:
			w.Status = store.SliceFlowReleased
		case store.SliceFlowReleasing, store.SliceFlowReleased:
		}
		w.ReleaseRequested, w.UpdatedAt = true, s.now().UTC()
		return nil
	})
	if err != nil {
		return store.Allocation{}, fmt.Errorf("sliceflow %s: release: %w", id, err)
	}
	switch w.Status {
	case store.SliceFlowReleasing:
		s.setAllocation(ctx, w, api.AllocationReleasing, "")
	case store.SliceFlowReleased:
		s.setAllocation(ctx, w, api.AllocationReleased, w.Error)
	}
	if err := s.Advance(ctx, id); err != nil {
		s.log.Warn("slice workflow release", "allocation_id", id, "err", err, "correlation_id", w.CorrelationID)
	}
	return s.store.GetAllocation(ctx, id)
}

// lock serialises the advances of one allocation on this replica.
func (s *Room) lock(id string) func() {
	s.mu.Lock()
	l, ok := s.locks[id]
	if !ok {
		l = &sync.Mutex{}
		s.locks[id] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// setAllocation moves the allocation to state with reason, and stores its
// allocation.state record with it (best effort: the workflow's own record
// is the source of truth and is resumed).
func (s *Room) setAllocation(ctx context.Context, w store.SliceWorkflow, state api.AllocationState, reason string) {
	_, err := s.store.UpdateAllocationAudited(ctx, w.AllocationID, func(a *store.Allocation) error {
		if a.State == state && a.StateReason == reason && a.ProvisionTaskID == w.ProvisionTaskID && a.ReleaseTaskID == w.ReleaseTaskID {
			return errNoChange
		}
		a.State, a.StateReason, a.UpdatedAt = state, reason, s.now().UTC()
		a.ProvisionTaskID, a.ReleaseTaskID = w.ProvisionTaskID, w.ReleaseTaskID
		return nil
	}, func(a store.Allocation) []store.AuditEvent {
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: "system", Action: "allocation.state", Target: a.ID,
			Result: string(a.State), CID: w.CorrelationID, Detail: "slice workflow step=" + w.Step + " " + reason})}
	})
	if err != nil && !errors.Is(err, errNoChange) {
		s.log.Warn("slice allocation state", "allocation_id", w.AllocationID, "state", state, "err", err,
			"correlation_id", w.CorrelationID)
	}
}

var errNoChange = errors.New("no change")

func orSystem(a string) string {
	if a == "" {
		return "system"
	}
	return a
}
