// Package postgres owns the PostgreSQL adapter of store.Store: a pgxpool
// connection pool, migrations (goose through pgx's database/sql bridge)
// serialised across replicas by an advisory lock, the dialect hooks that
// sqlstore needs (row locks, SKIP LOCKED claims, one batched heartbeat
// statement), a group commit of task claims and results (batch.go) and
// change notifications that cross replicas: every change runs pg_notify in
// its transaction, and Subscribe fans out what one dedicated LISTEN
// connection per Store receives.
package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/migrations"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// Channel is the NOTIFY channel; payloads are "<kind>:<id>".
const Channel = "drover_events"

// migrationLockID is the pg_advisory_lock key held while migrating
// ("drover" in ASCII).
const migrationLockID int64 = 0x64726f766572

// Store is a store.Store over a PostgreSQL database.
type Store struct {
	*sqlstore.Store
	pool  *pgxpool.Pool
	hub   *sqlstore.Broadcaster
	lis   *listener
	batch *taskBatcher
}

var _ store.Store = (*Store)(nil)

// Open connects to dsn (a libpq URL or key/value string), applies pending
// migrations under an advisory lock, and returns the store. Several
// replicas may Open the same database at once.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse dsn: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	hub := sqlstore.NewBroadcaster()
	base := sqlstore.New(&poolDB{pool: pool}, sqlstore.Dialect{
		Name:              "postgres",
		ForUpdate:         " FOR UPDATE",
		SkipLocked:        " FOR UPDATE SKIP LOCKED",
		ClaimMany:         "= ANY(ARRAY(%s))",
		Notify:            notify,
		TouchHosts:        touchHosts,
		IsUniqueViolation: isUniqueViolation,
	})
	s := &Store{
		Store: base,
		pool:  pool,
		hub:   hub,
		lis:   newListener(pool.Config().ConnConfig, hub),
		batch: newTaskBatcher(pool, base.AuditColumns),
	}
	return s, nil
}

// migrate runs the migrations while holding a session advisory lock on a
// dedicated connection, so replicas starting together apply them once.
func migrate(ctx context.Context, pool *pgxpool.Pool) (err error) {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return fmt.Errorf("postgres: migrate: lock connection: %w", err)
	}
	// Closing the session releases the lock even if unlock fails.
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLockID); err != nil {
		return fmt.Errorf("postgres: migrate: advisory lock: %w", err)
	}
	defer func() {
		_, uerr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrationLockID)
		if err == nil && uerr != nil {
			err = fmt.Errorf("postgres: migrate: advisory unlock: %w", uerr)
		}
	}()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db, goose.DialectPostgres); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
}

// Subscribe implements store.Store. The first call opens the LISTEN
// connection and returns only once it is listening, so every event
// committed afterwards, by any replica, is delivered. If that connection
// later drops it is re-established with backoff; events committed while it
// was down are lost, so once it is back store.EventResync is published and
// consumers re-read everything they wait for.
func (s *Store) Subscribe(ctx context.Context) (<-chan store.Event, error) {
	if err := s.lis.start(ctx); err != nil {
		return nil, err
	}
	return s.hub.Subscribe(ctx), nil
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: ping: %w", err)
	}
	return nil
}

// Close implements store.Store: the listener stops, subscriptions end,
// the group commit in progress is answered (later claims and results get
// an error) and the pool closes.
func (s *Store) Close() error {
	s.lis.close()
	s.batch.close()
	s.hub.Close()
	s.pool.Close()
	return nil
}

// ListenStats reports whether the LISTEN connection is up now and how many
// times it was re-established after dropping (for metrics).
func (s *Store) ListenStats() (listening bool, reconnects uint64) {
	return s.lis.listening.Load(), s.lis.reconnects.Load()
}

// Pool returns the connection pool, e.g. for metrics.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// notify is the Dialect.Notify hook; PostgreSQL delivers on commit.
func notify(ctx context.Context, tx sqlstore.DB, ev store.Event) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify('`+Channel+`', $1)`, string(ev.Kind)+":"+ev.ID)
	return err
}

// touchHosts is the Dialect.TouchHosts hook: one statement per batch. The
// "old" CTE locks the rows in id order (so concurrent batches cannot
// deadlock) and remembers their status, which RETURNING alone cannot see.
func touchHosts(ctx context.Context, db sqlstore.DB, ids []string, ats []int64, now int64) ([]string, error) {
	rows, err := db.Query(ctx, `WITH v AS (
			SELECT id, at FROM unnest($1::text[], $2::bigint[]) AS t(id, at)
		), old AS (
			SELECT h.id, h.status FROM hosts h JOIN v ON v.id = h.id ORDER BY h.id FOR UPDATE OF h
		), upd AS (
			UPDATE hosts h SET
				last_seen_at = GREATEST(h.last_seen_at, v.at),
				status = CASE WHEN h.status IN ('stale', 'unknown') THEN 'healthy' ELSE h.status END,
				updated_at = CASE WHEN h.status IN ('stale', 'unknown') THEN $3 ELSE h.updated_at END
			FROM v JOIN old ON old.id = v.id
			WHERE h.id = v.id AND (h.last_seen_at < v.at OR h.status IN ('stale', 'unknown'))
			RETURNING h.id, old.status
		)
		SELECT id FROM upd WHERE status IN ('stale', 'unknown')`, ids, ats, now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// isRetryable reports a deadlock or serialisation failure: the transaction
// was rolled back and may simply be run again.
func isRetryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}
