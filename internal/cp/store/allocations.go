package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Allocation binds a user to a host (bare metal) or to an instance on
// HostID. Spec is the api.CreateAllocationRequest it was created from (SSH
// keys, shell, sudo), kept so a release can name the user it provisioned.
type Allocation struct {
	ID              string
	Username        string
	HostID          string
	InstanceID      string // "" for host allocations
	State           api.AllocationState
	StateReason     string
	Spec            json.RawMessage
	ProvisionTaskID string
	ReleaseTaskID   string
	CreatedBy       string
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// IsSlice reports whether the allocation is a GPU slice allocation (its
// Spec asks for slots): its user lives in a slice VM, not on the host.
func (a Allocation) IsSlice() bool {
	var req api.SliceRequest
	return len(a.Spec) > 0 && json.Unmarshal(a.Spec, &req) == nil && req.Slots > 0
}

// AllocationFilter narrows ListAllocations. Zero fields do not filter.
type AllocationFilter struct {
	HostID     string
	InstanceID string
	State      api.AllocationState
}

// AllocationStore is the allocations of users to hosts and instances: the
// allocations room (cp/allocations: its routes and state machine) embeds it
// whole; the termgw room only reads allocations.
type AllocationStore interface {
	// CreateAllocation inserts an allocation, with audit in its
	// transaction; ErrConflict if the id exists.
	CreateAllocation(ctx context.Context, a Allocation, audit ...AuditEvent) error
	// GetAllocation returns an allocation or ErrNotFound.
	GetAllocation(ctx context.Context, id string) (Allocation, error)
	// ListAllocations returns allocations, oldest first.
	ListAllocations(ctx context.Context, f AllocationFilter) ([]Allocation, error)
	// UpdateAllocation applies fn to the allocation in one transaction and
	// sets UpdatedAt to the value fn leaves; ErrNotFound if it does not
	// exist. An error from fn aborts the update and is returned. Publishes
	// EventAllocation.
	UpdateAllocation(ctx context.Context, id string, fn func(*Allocation) error) (Allocation, error)
	// UpdateAllocationAudited is UpdateAllocation that also appends, in
	// the same transaction, the records audit returns for the allocation
	// as fn left it (nil: none). audit runs inside the transaction and
	// must not call the store.
	UpdateAllocationAudited(ctx context.Context, id string, fn func(*Allocation) error,
		audit func(Allocation) []AuditEvent) (Allocation, error)
}
