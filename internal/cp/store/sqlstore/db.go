// Package sqlstore owns the one SQL implementation of store.Store. It is
// written once, in the portable SQL subset of the migrations package with
// $N placeholders (which modernc.org/sqlite accepts as ordinals), over the
// small DB interface below that both database/sql (SQLite) and pgxpool
// (PostgreSQL) satisfy. The few places where the databases differ are the
// Dialect hooks: row-lock suffixes, the change-notification hook, the batched
// heartbeat statement and error classification. The adapters (sqlite,
// postgres) own connections, Subscribe, Ping and Close.
package sqlstore

import (
	"context"
	"errors"

	"github.com/drover-dev/drover/internal/cp/store"
)

// ErrNoRows is what Row.Scan returns when the query produced no row. DB
// implementations translate their driver's sentinel to it.
var ErrNoRows = errors.New("sqlstore: no rows in result set")

// DB is the database handle the store runs on: a connection pool or a
// transaction. Statements use $1, $2, ... placeholders.
type DB interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// Query runs a statement that returns rows. The caller closes Rows.
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	// QueryRow runs a statement expected to return at most one row; its Scan
	// returns ErrNoRows when there is none.
	QueryRow(ctx context.Context, query string, args ...any) Row
	// InTx runs fn in a transaction and commits when fn returns nil. The
	// transaction must be able to hold row locks until it ends: SQLite
	// begins it IMMEDIATE (one writer at a time), PostgreSQL uses READ
	// COMMITTED with SELECT ... FOR UPDATE. Called on a transaction, InTx
	// runs fn in that same transaction.
	InTx(ctx context.Context, fn func(tx DB) error) error
}

// Rows is a result set, iterated like database/sql's.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Row is a single-row result.
type Row interface {
	Scan(dest ...any) error
}

// Dialect holds what differs between the databases.
type Dialect struct {
	// Name is informational ("sqlite", "postgres").
	Name string
	// ForUpdate is appended to a SELECT whose rows the transaction will
	// update: " FOR UPDATE" on PostgreSQL, "" on SQLite (whose IMMEDIATE
	// transaction already excludes other writers).
	ForUpdate string
	// SkipLocked is appended to the SELECT that picks a task to claim:
	// " FOR UPDATE SKIP LOCKED" on PostgreSQL, "" on SQLite.
	SkipLocked string
	// ClaimIndex follows "FROM tasks" in the SELECT that picks a task to
	// claim: SQLite's planner, without statistics, prefers the
	// (state, expires_at) index and so scans every queued task of every
	// node on each claim; " INDEXED BY tasks_node_state_created" makes it
	// read the claiming node's queued tasks only. "" on PostgreSQL.
	ClaimIndex string
	// ClaimMany is how a claim of several tasks names the rows its SELECT
	// picked, with %s the SELECT: "" is "IN (%s)", right on SQLite, whose
	// uncorrelated IN subquery runs once. PostgreSQL's planner may run
	// such a subquery again for each row it updates, and with SKIP LOCKED
	// every run picks other rows (a first version of the claim took 283
	// tasks where it asked for 7): "= ANY(ARRAY(%s))" runs it once, before
	// the update, whatever the plan.
	ClaimMany string
	// PeekClaim makes a claim look for a queued task with a read first and
	// take the write path only when there is one. On SQLite, whose writes
	// all go through one connection, most claims find nothing (every
	// long-poll claims when it starts and when it is woken, and an idle
	// node re-polls every long-poll timeout): they are then answered by a
	// reader and never wait for, or delay, the writer. A claim that finds a
	// task by the read still claims it with the conditional update, so two
	// claimers never get the same task. PostgreSQL claims concurrently and
	// does not need it.
	PeekClaim bool
	// Notify publishes ev to every replica's subscribers once tx commits and
	// not at all if it rolls back. It is called inside the transaction that
	// made the change. PostgreSQL: pg_notify on tx. SQLite: queue on the
	// transaction and publish in-process after commit.
	Notify func(ctx context.Context, tx DB, ev store.Event) error
	// TouchHosts optionally replaces the portable per-row loop of
	// Store.TouchHosts with one batched statement. ids are distinct, ats[i]
	// is the newest observation of ids[i] in unix milliseconds and now is
	// the time to stamp into updated_at of revived hosts. It raises
	// last_seen_at (never lowers it), turns stale/unknown hosts healthy and
	// returns the ids whose status it changed.
	TouchHosts func(ctx context.Context, db DB, ids []string, ats []int64, now int64) ([]string, error)
	// IsUniqueViolation reports whether err is a primary-key or unique
	// constraint violation.
	IsUniqueViolation func(err error) bool
	// StatementRollback says that a refused statement leaves its
	// transaction usable (SQLite undoes the statement alone; PostgreSQL
	// aborts the transaction), so an audit insert inside one can be a
	// plain INSERT, retried under new ids on a collision.
	StatementRollback bool
}
