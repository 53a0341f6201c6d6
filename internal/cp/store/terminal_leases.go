package store

import (
	"context"
	"time"
)

// TerminalLease says which replica holds a live terminal session, until
// when (table terminal_session_leases).
type TerminalLease struct {
	SessionID  string
	Replica    string
	LeaseUntil time.Time
}

// TerminalLeaseStore is the terminal sessions' liveness leases: the
// replica holding a session renews its lease; a lease that expired names a
// session whose replica died, which another replica fails (cp/termgw). It
// is not part of Store: the gateway uses it when its store has it (both
// SQL stores do).
type TerminalLeaseStore interface {
	// RenewTerminalLease inserts or extends the lease of session id.
	RenewTerminalLease(ctx context.Context, l TerminalLease) error
	// DeleteTerminalLease removes a session's lease (no error if absent).
	DeleteTerminalLease(ctx context.Context, sessionID string) error
	// ExpiredTerminalLeases returns up to limit leases whose LeaseUntil is
	// before now, oldest first.
	ExpiredTerminalLeases(ctx context.Context, now time.Time, limit int) ([]TerminalLease, error)
}
