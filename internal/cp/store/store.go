// Package store owns the control plane's persistent state: the Store port,
// its models and its sentinel errors. The adapters live in sub-packages
// (sqlite, postgres) and share one SQL implementation (sqlstore) and one set
// of embedded migrations (migrations). This package must not know about HTTP,
// TLS or task semantics beyond the state machine the queries enforce.
//
// The port is split by room, one file each: HostStore (hosts.go), SlotStore
// (slots.go), TaskStore (tasks.go), InstanceStore (instances.go),
// AllocationStore (allocations.go), TerminalStore (terminals.go),
// OperatorTokenStore (operator_tokens.go), AuditStore (audit.go), KeyStore
// (keys.go), EventStore (events.go), PreflightStore (preflight.go),
// WorkloadSecretStore (workload_secrets.go), SliceFlowStore (slices.go) and
// DashboardSessionStore (dashboard_sessions.go), each with its models and
// filters.
// Store is their composition; a room declares the small interface it needs,
// embedding a whole XxxStore where it uses all of it.
package store

import (
	"context"
	"errors"
)

// Sentinel errors; adapters wrap them with context.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
)

// Store is the persistence port of the control plane: every room's store
// and the database's lifecycle. The control plane's assembly (cp/server),
// the CLI and the benchmark hold one and hand each room its part; every
// adapter implements all of it and passes storetest. Every method is safe
// for concurrent use by several replicas sharing one database.
type Store interface {
	HostStore
	SlotStore
	TaskStore
	InstanceStore
	AllocationStore
	TerminalStore
	OperatorTokenStore
	AuditStore
	KeyStore
	EventStore
	PreflightStore
	WorkloadSecretStore
	SliceFlowStore
	DashboardSessionStore

	// Ping checks the database is reachable (for /readyz).
	Ping(ctx context.Context) error
	// Close releases the database.
	Close() error
}
