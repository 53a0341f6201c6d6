package store

import "context"

// Event is a change notification delivered to every replica.
type Event struct {
	Kind EventKind
	// ID is the node id for task events, the host id for host events, the
	// id of the instance's host for instance events, the allocation id for
	// allocation events and the token id for operator token events.
	ID string
}

// EventKind says what changed.
type EventKind string

// Event kinds.
const (
	EventTask EventKind = "task" // a task became claimable for node ID
	EventHost EventKind = "host" // host ID's record changed (disable, revoke, drain, ...)
	// EventInstance: an instance assigned to host ID was created, changed or
	// removed.
	EventInstance EventKind = "instance"
	// EventAllocation: allocation ID changed (released, failed, ...).
	EventAllocation EventKind = "allocation"
	// EventOperatorToken: operator token ID was revoked.
	EventOperatorToken EventKind = "operator_token"
	// EventResync: events may have been lost (PostgreSQL's LISTEN
	// connection was re-established after an outage); ID is empty and every
	// consumer re-reads what it waits for, as if each id had changed. It is
	// published only to this replica's subscribers, never stored or sent.
	EventResync EventKind = "resync"
)

// EventStore is the change notifications between replicas (LISTEN/NOTIFY on
// PostgreSQL, in-process on SQLite): the control plane's assembly
// subscribes once and wakes the rooms (the tasks and instances long-polls,
// the host cache, terminal revocation).
type EventStore interface {
	// Subscribe delivers change events from every replica until ctx ends.
	// Delivery is best-effort and may coalesce; consumers re-read the store.
	Subscribe(ctx context.Context) (<-chan Event, error)
}
