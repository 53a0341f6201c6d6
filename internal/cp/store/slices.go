package store

import (
	"context"
	"encoding/json"
	"time"
)

// SliceFlowStatus is where a slice allocation's workflow is.
type SliceFlowStatus string

// Workflow statuses. provisioning runs the provisioning steps; a failing
// step moves it to compensating (cleanup on the node, leases freed) and
// then failed; a release moves it to releasing and then released.
const (
	SliceFlowProvisioning SliceFlowStatus = "provisioning"
	SliceFlowActive       SliceFlowStatus = "active"
	SliceFlowCompensating SliceFlowStatus = "compensating"
	SliceFlowFailed       SliceFlowStatus = "failed"
	SliceFlowReleasing    SliceFlowStatus = "releasing"
	SliceFlowReleased     SliceFlowStatus = "released"
)

// Finished reports whether no step is left to run.
func (s SliceFlowStatus) Finished() bool {
	return s == SliceFlowActive || s == SliceFlowFailed || s == SliceFlowReleased
}

// SliceWorkflow is the provisioning workflow of one slice allocation
// (internal/cp/sliceflow). Spec is its input (the create request), Plan the
// leased slots and VM name once lease_slots ran, Result the VM's address,
// readiness and performance once record_result ran.
type SliceWorkflow struct {
	AllocationID     string
	HostID           string
	Status           SliceFlowStatus
	Step             string // the step running or last run
	Spec             json.RawMessage
	Plan             json.RawMessage
	Result           json.RawMessage
	ProvisionTaskID  string
	ReleaseTaskID    string
	FailedStep       string
	Signal           string
	Error            string
	CorrelationID    string
	ReleaseRequested bool
	CreatedAt        time.Time
	UpdatedAt        time.Time
}

// Slice workflow step states.
const (
	SliceStepStarted = "started"
	SliceStepDone    = "done"
	SliceStepFailed  = "failed"
	SliceStepSkipped = "skipped"
)

// SliceStep is one recorded step of a slice workflow. Key is its
// idempotency key (SliceStepKey): a step is recorded once, before its side
// effect, and a resumed workflow finds it.
type SliceStep struct {
	Key          string
	AllocationID string
	Step         string
	Seq          int64 // order of recording within the workflow
	State        string
	TaskID       string // the task the step enqueued or awaits
	Detail       string
	StartedAt    time.Time
	EndedAt      time.Time // zero while started
}

// SliceStepKey is the idempotency key of a workflow step.
func SliceStepKey(allocationID, step string) string { return allocationID + "/" + step }

// SlotLease makes an approved slot exclusive to one slice allocation.
type SlotLease struct {
	HostID       string
	SlotID       string
	AllocationID string
	LeasedAt     time.Time
}

// SliceFlowStore is the slice allocations' workflows, their steps and the
// slot leases: the sliceflow room embeds it whole.
type SliceFlowStore interface {
	// CreateSliceWorkflow inserts a workflow; ErrConflict if one exists for
	// the allocation.
	CreateSliceWorkflow(ctx context.Context, w SliceWorkflow) error
	// GetSliceWorkflow returns a workflow or ErrNotFound.
	GetSliceWorkflow(ctx context.Context, allocationID string) (SliceWorkflow, error)
	// ListSliceWorkflows returns workflows, oldest first; unfinished limits
	// them to those with steps left to run (not active, failed or released).
	ListSliceWorkflows(ctx context.Context, unfinished bool) ([]SliceWorkflow, error)
	// UpdateSliceWorkflow applies fn to the workflow in one transaction
	// (the row locked); ErrNotFound if absent. An error from fn aborts the
	// update and is returned. UpdatedAt is stored as fn leaves it.
	UpdateSliceWorkflow(ctx context.Context, allocationID string, fn func(*SliceWorkflow) error) (SliceWorkflow, error)

	// BeginSliceStep records st (state started unless set) under its Key
	// unless that key is recorded already; it returns the stored step and
	// whether this call recorded it. Seq is assigned by the store.
	BeginSliceStep(ctx context.Context, st SliceStep) (SliceStep, bool, error)
	// UpdateSliceStep stores st's state, task id, detail and end time under
	// st.Key; ErrNotFound if the key is not recorded.
	UpdateSliceStep(ctx context.Context, st SliceStep) error
	// ListSliceSteps returns a workflow's steps in recording order.
	ListSliceSteps(ctx context.Context, allocationID string) ([]SliceStep, error)

	// LeaseSlots leases slotIDs of hostID to allocationID atomically: all
	// or none. Leasing again what the allocation already holds is a no-op;
	// ErrConflict if another allocation holds any of them.
	LeaseSlots(ctx context.Context, allocationID, hostID string, slotIDs []string, at time.Time) error
	// ListSlotLeases returns the leases of hostID ("" for every host), by
	// host and slot id.
	ListSlotLeases(ctx context.Context, hostID string) ([]SlotLease, error)
	// FreeSlotLeases removes an allocation's leases and returns how many
	// it held.
	FreeSlotLeases(ctx context.Context, allocationID string) (int, error)
}
