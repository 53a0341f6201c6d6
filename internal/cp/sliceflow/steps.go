package sliceflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// The steps, by name (the names are the contract: API, CLI, runbook).
const (
	StepLeaseSlots     = "lease_slots"
	StepVMProvision    = "vm_provision"
	StepAwaitProvision = "await_provision"
	StepRecordResult   = "record_result"
	StepProvisionUser  = "provision_user"
	StepActivate       = "activate"
	StepReleaseVM      = "release_vm"
	StepAwaitRelease   = "await_release"
	StepFreeLeases     = "free_leases"
	// StepDeprovisionUser runs only compensating
	// (compensate_deprovision_user).
	StepDeprovisionUser = "deprovision_user"
	compensatePrefix    = "compensate_"
)

type outcomeKind int

const (
	done outcomeKind = iota
	skipped
	wait
	fail
)

// outcome is what a step did: done or skipped (with a detail), wait (for a
// task event), or fail (with its signal).
type outcome struct {
	kind   outcomeKind
	detail string
	signal signal.Name
}

type stepFn func(ctx context.Context, w *store.SliceWorkflow, rec *store.SliceStep) (outcome, error)

type step struct {
	name string
	run  stepFn
}

// sequence is the steps a workflow in status runs, in order.
func (s *Room) sequence(st store.SliceFlowStatus) []step {
	switch st {
	case store.SliceFlowProvisioning:
		return []step{{StepLeaseSlots, s.leaseSlots}, {StepVMProvision, s.enqueueProvision},
			{StepAwaitProvision, s.awaitProvision}, {StepRecordResult, s.recordResult},
			{StepProvisionUser, s.provisionUser}, {StepActivate, s.activate}}
	case store.SliceFlowCompensating:
		return []step{{compensatePrefix + StepDeprovisionUser, s.deprovisionUser}, {compensatePrefix + StepReleaseVM, s.enqueueRelease},
			{compensatePrefix + StepAwaitRelease, s.awaitRelease}, {compensatePrefix + StepFreeLeases, s.freeLeases}}
	case store.SliceFlowReleasing:
		return []step{{StepReleaseVM, s.enqueueRelease}, {StepAwaitRelease, s.awaitRelease}, {StepFreeLeases, s.freeLeases}}
	}
	return nil
}

// Advance runs an allocation's workflow from its last recorded step as far
// as it goes without waiting for a task. An error (the store, a crash in
// tests) leaves the workflow where its records say: the next Advance
// (a task event, Resume) goes on from there.
func (s *Room) Advance(ctx context.Context, id string) error {
	defer s.lock(id)()
	for range 64 {
		w, err := s.store.GetSliceWorkflow(ctx, id)
		if err != nil {
			return fmt.Errorf("sliceflow %s: %w", id, err)
		}
		if w.Status.Finished() {
			return nil
		}
		if w.Status == store.SliceFlowProvisioning && w.ReleaseRequested {
			// Released while provisioning: stop at this step boundary
			// (an awaited provision task has finished, or none was queued)
			// and release what was made.
			if ok, err := s.provisionSettled(ctx, w); err != nil || !ok {
				return err
			}
			if err := s.setStatus(ctx, &w, store.SliceFlowReleasing); err != nil {
				return err
			}
			s.setAllocation(ctx, w, api.AllocationReleasing, "")
			continue
		}
		more, err := s.runNext(ctx, &w)
		if err != nil {
			return fmt.Errorf("sliceflow %s (correlation_id %s): step %s: %w", id, w.CorrelationID, w.Step, err)
		}
		if !more {
			return nil
		}
	}
	return fmt.Errorf("sliceflow %s: too many steps in one advance", id)
}

// runNext runs the first step of w's sequence not done, or finishes the
// sequence; more is false when the workflow waits or finished.
func (s *Room) runNext(ctx context.Context, w *store.SliceWorkflow) (more bool, err error) {
	recs, err := s.steps(ctx, w.AllocationID)
	if err != nil {
		return false, err
	}
	for _, st := range s.sequence(w.Status) {
		rec, ok := recs[st.name]
		if ok && (rec.State == store.SliceStepDone || rec.State == store.SliceStepSkipped || rec.State == store.SliceStepFailed) {
			continue
		}
		if !ok {
			// Recorded before its side effect, under its idempotency key.
			if rec, _, err = s.store.BeginSliceStep(ctx, store.SliceStep{Key: store.SliceStepKey(w.AllocationID, st.name),
				AllocationID: w.AllocationID, Step: st.name, StartedAt: s.now().UTC()}); err != nil {
				return false, err
			}
		}
		if w.Step != st.name {
			name := st.name
			if err := s.update(ctx, w, func(w *store.SliceWorkflow) { w.Step = name }); err != nil {
				return false, err
			}
		}
		if err := s.at("begin:" + st.name); err != nil {
			return false, err
		}
		out, err := st.run(ctx, w, &rec)
		if err != nil {
			return false, err
		}
		switch out.kind {
		case wait:
			return false, nil
		case fail:
			return true, s.failStep(ctx, w, rec, out)
		}
		rec.State, rec.Detail, rec.EndedAt = store.SliceStepDone, out.detail, s.now().UTC()
		if out.kind == skipped {
			rec.State = store.SliceStepSkipped
		}
		if err := s.store.UpdateSliceStep(ctx, rec); err != nil {
			return false, err
		}
		return true, s.at("done:" + st.name)
	}
	return false, s.finish(ctx, w)
}

// failStep moves the workflow to compensating (or, for a failing release,
// records the failure and goes on releasing) and records the step failed.
// The workflow's record is written first: a crash between the two leaves
// a workflow that compensates, never one that forgets its failure.
func (s *Room) failStep(ctx context.Context, w *store.SliceWorkflow, rec store.SliceStep, out outcome) error {
	if w.Status == store.SliceFlowProvisioning {
		if err := s.update(ctx, w, func(w *store.SliceWorkflow) {
			w.Status, w.FailedStep, w.Signal, w.Error = store.SliceFlowCompensating, rec.Step, string(out.signal), out.detail
		}); err != nil {
			return err
		}
		s.setAllocation(ctx, *w, api.AllocationProvisioning, "compensating: "+reason(*w))
	}
	rec.State, rec.Detail, rec.EndedAt = store.SliceStepFailed, out.detail, s.now().UTC()
	return s.store.UpdateSliceStep(ctx, rec)
}

// finish ends a sequence: provisioning → active, compensating → failed
// (released if a release was asked meanwhile), releasing → released.
func (s *Room) finish(ctx context.Context, w *store.SliceWorkflow) error {
	var (
		next  store.SliceFlowStatus
		state api.AllocationState
		why   string
	)
	switch w.Status {
	case store.SliceFlowProvisioning:
		next, state = store.SliceFlowActive, api.AllocationActive
	case store.SliceFlowCompensating:
		next, state, why = store.SliceFlowFailed, api.AllocationFailed, reason(*w)
		if w.ReleaseRequested {
			next, state = store.SliceFlowReleased, api.AllocationReleased
		}
	case store.SliceFlowReleasing:
		next, state = store.SliceFlowReleased, api.AllocationReleased
	default:
		return nil
	}
	if err := s.setStatus(ctx, w, next); err != nil {
		return err
	}
	s.setAllocation(ctx, *w, state, why)
	s.audit.Record(ctx, audit.Entry{Actor: "system", Action: "slice.workflow." + string(next), Target: w.AllocationID,
		Result: string(next), CID: w.CorrelationID, Detail: why})
	return nil
}

// reason is a failed workflow's state reason: the step, the signal, the
// error and the correlation id.
func reason(w store.SliceWorkflow) string {
	return fmt.Sprintf("step %s: %s: %s (correlation_id %s)", w.FailedStep, w.Signal, w.Error, w.CorrelationID)
}

func (s *Room) setStatus(ctx context.Context, w *store.SliceWorkflow, st store.SliceFlowStatus) error {
	return s.update(ctx, w, func(w *store.SliceWorkflow) { w.Status = st })
}

func (s *Room) update(ctx context.Context, w *store.SliceWorkflow, fn func(*store.SliceWorkflow)) error {
	got, err := s.store.UpdateSliceWorkflow(ctx, w.AllocationID, func(x *store.SliceWorkflow) error {
		fn(x)
		x.UpdatedAt = s.now().UTC()
		return nil
	})
	if err != nil {
		return err
	}
	*w = got
	return nil
}

func (s *Room) steps(ctx context.Context, id string) (map[string]store.SliceStep, error) {
	list, err := s.store.ListSliceSteps(ctx, id)
	if err != nil {
		return nil, err
	}
	m := make(map[string]store.SliceStep, len(list))
	for _, st := range list {
		m[st.Step] = st
	}
	return m, nil
}

func (s *Room) at(point string) error {
	if s.hook == nil {
		return nil
	}
	return s.hook(point)
}

// provisionSettled reports whether a workflow released while provisioning
// may switch to releasing now: no provision task is queued, or it finished
// (and so did the provision_user task, when one was queued).
func (s *Room) provisionSettled(ctx context.Context, w store.SliceWorkflow) (bool, error) {
	if w.ProvisionTaskID == "" {
		return true, nil
	}
	if ok, err := s.userTaskSettled(ctx, w); err != nil || !ok {
		return false, err
	}
	t, err := s.store.GetTask(ctx, w.ProvisionTaskID)
	if errors.Is(err, store.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return t.State.Terminal(), nil
}

func specOf(w store.SliceWorkflow) (api.CreateAllocationRequest, error) {
	var req api.CreateAllocationRequest
	if err := json.Unmarshal(w.Spec, &req); err != nil {
		return req, fmt.Errorf("decode workflow spec: %w", err)
	}
	return req, nil
}

func planOf(w store.SliceWorkflow) (plan, error) {
	var p plan
	if len(w.Plan) == 0 {
		return p, nil
	}
	if err := json.Unmarshal(w.Plan, &p); err != nil {
		return p, fmt.Errorf("decode workflow plan: %w", err)
	}
	return p, nil
}

// enqueue queues the task a step recorded (rec.TaskID), building it with
// build the first time; the id is recorded before the task is queued, so
// a resumed step queues the same task, and a task already queued is
// conflict, which is success.
func (s *Room) enqueue(ctx context.Context, w *store.SliceWorkflow, rec *store.SliceStep, typ string, params []byte) (string, error) {
	if rec.TaskID != "" {
		if _, err := s.store.GetTask(ctx, rec.TaskID); err == nil {
			return rec.TaskID, nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return "", err
		}
	}
	t := s.tasks.NewTask(ctx, w.HostID, typ, params, taskTTL)
	if rec.TaskID != "" {
		t.ID = rec.TaskID
	}
	t.CorrelationID = w.CorrelationID
	if rec.TaskID == "" {
		rec.TaskID = t.ID
		if err := s.store.UpdateSliceStep(ctx, *rec); err != nil {
			return "", err
		}
	}
	if err := s.tasks.Enqueue(ctx, t); err != nil && !errors.Is(err, store.ErrConflict) {
		return "", err
	}
	return t.ID, nil
}
