package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Instance is a declarative VM instance: the operator sets Spec and
// DesiredState (each change bumps Generation); the agent of HostID reports
// Phase, ReasonCode, Message, Runtime and the generation it acted on.
type Instance struct {
	ID                 string
	Name               string // unique among all instance records
	Group              string // "" when not in a group
	HostID             string
	Labels             map[string]string
	Spec               json.RawMessage // api.InstanceSpec
	DesiredState       api.DesiredState
	Generation         int64 // bumped on every spec or desired-state change
	Phase              api.InstancePhase
	ReasonCode         api.ReasonCode
	Message            string
	ObservedGeneration int64
	Runtime            json.RawMessage // api.InstanceRuntime, or nil
	CreatedBy          string
	CreatedAt          time.Time
	UpdatedAt          time.Time
	StatusAt           time.Time // zero until the agent reports
}

// MaxInstanceEvents is how many status transitions the store keeps per
// instance: appending one more drops the oldest.
const MaxInstanceEvents = 200

// InstanceEvent is one recorded status transition of an instance: its
// creation, an operator's desired-state change, or a phase or reason change
// its agent reported. Actor is "node:<id>" or the operator's actor name.
type InstanceEvent struct {
	InstanceID         string
	Seq                int64 // assigned by the store: 1, 2, ... per instance, in append order
	At                 time.Time
	Phase              api.InstancePhase
	ReasonCode         api.ReasonCode
	Message            string
	DesiredState       api.DesiredState
	Generation         int64
	ObservedGeneration int64
	Actor              string
	CorrelationID      string
}

// InstanceFilter narrows ListInstances. Zero fields do not filter.
type InstanceFilter struct {
	HostID string
	Group  string
}

// InstanceRecords is what an instance's change stores with it: its event
// (nil: none) and audit records.
type InstanceRecords struct {
	Event *InstanceEvent
	Audit []AuditEvent
}

// InstanceStore is the declarative instance records: the instances room
// (cp/instances: the instance routes, placement, the node's desired set and
// status reports) embeds it whole; the termgw room only reads instances.
type InstanceStore interface {
	// CreateInstance inserts an instance; ErrConflict if the id or the name
	// exists. Publishes EventInstance for its host.
	CreateInstance(ctx context.Context, in Instance) error
	// CreateInstanceRecorded is CreateInstance that also appends ev as the
	// instance's first event in the same transaction (ev.InstanceID is
	// in.ID) and the audit records: a reader never sees a created instance
	// without them (ADR 0016).
	CreateInstanceRecorded(ctx context.Context, in Instance, ev InstanceEvent, audit ...AuditEvent) error
	// GetInstance returns an instance or ErrNotFound.
	GetInstance(ctx context.Context, id string) (Instance, error)
	// GetInstanceByName returns an instance or ErrNotFound.
	GetInstanceByName(ctx context.Context, name string) (Instance, error)
	// ListInstances returns instances ordered by name.
	ListInstances(ctx context.Context, f InstanceFilter) ([]Instance, error)
	// UpdateInstance reads the instance, applies fn and writes the result in
	// one transaction that locks the row, like UpdateHost; ErrConflict if fn
	// renames it to a taken name. Publishes EventInstance for its host (both
	// hosts when fn moves it).
	UpdateInstance(ctx context.Context, id string, fn func(*Instance) error) (Instance, error)
	// UpdateInstanceRecorded is UpdateInstance that also appends, in the
	// same transaction and only when fn succeeds, what record returns for
	// the instance as read and as written: its event (as this instance's;
	// none when nil) and audit records. A reader never sees a transition
	// without its event, nor an operator's change without its record (ADR
	// 0016). record runs inside the transaction and must not call the
	// store.
	UpdateInstanceRecorded(ctx context.Context, id string, fn func(*Instance) error,
		record func(before, after Instance) InstanceRecords) (Instance, error)
	// DeleteInstance removes an instance record and its events, and
	// appends the audit records, in one transaction; ErrNotFound if absent.
	// Publishes EventInstance for its host.
	DeleteInstance(ctx context.Context, id string, audit ...AuditEvent) error
	// AppendInstanceEvent records a status transition of an existing
	// instance (ErrNotFound otherwise), assigning its Seq (ev.Seq is
	// ignored; a zero At is now), and drops the instance's oldest events
	// beyond MaxInstanceEvents.
	AppendInstanceEvent(ctx context.Context, ev InstanceEvent) error
	// ListInstanceEvents returns the last limit events of an instance,
	// oldest first (limit <= 0: all that are kept). An unknown instance has
	// none.
	ListInstanceEvents(ctx context.Context, instanceID string, limit int) ([]InstanceEvent, error)
}
