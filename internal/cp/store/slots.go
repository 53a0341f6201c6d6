package store

import (
	"context"
	"encoding/json"
	"time"
)

// Slot is a node resource slot an operator approved from a
// slice.topology_discover candidate. Spec is the candidate as discovered.
type Slot struct {
	HostID     string
	SlotID     string
	Index      int
	Spec       json.RawMessage
	SourceTask string // the discovery task it was approved from
	ApprovedBy string
	ApprovedAt time.Time
}

// SlotStore is the approved slots of hosts: the hosts room (cp/hosts, the
// slot routes) embeds it whole; the instances room (placement, the slot
// check of slice tasks) only lists slots.
type SlotStore interface {
	// ApproveSlots records approved slots and the audit records
	// atomically; ErrConflict if any (host, slot id) is already approved.
	ApproveSlots(ctx context.Context, slots []Slot, audit ...AuditEvent) error
	// ListSlots returns a host's approved slots by index.
	ListSlots(ctx context.Context, hostID string) ([]Slot, error)
	// DeleteSlot removes an approved slot with the audit records;
	// ErrNotFound if absent.
	DeleteSlot(ctx context.Context, hostID, slotID string, audit ...AuditEvent) error
}
