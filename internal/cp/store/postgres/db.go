package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// querier is what *pgxpool.Pool and pgx.Tx have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func execOn(ctx context.Context, q querier, query string, args []any) (int64, error) {
	tag, err := q.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func queryOn(ctx context.Context, q querier, query string, args []any) (sqlstore.Rows, error) {
	r, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// poolDB is sqlstore.DB over the pool.
type poolDB struct{ pool *pgxpool.Pool }

func (p *poolDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return execOn(ctx, p.pool, query, args)
}

func (p *poolDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	return queryOn(ctx, p.pool, query, args)
}

func (p *poolDB) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return row{p.pool.QueryRow(ctx, query, args...)}
}

// maxTxAttempts bounds re-runs of a transaction that lost a deadlock.
const maxTxAttempts = 3

// InTx runs fn in a READ COMMITTED transaction; row locks come from the
// SELECT ... FOR UPDATE statements fn issues. A transaction chosen as a
// deadlock victim is run again (fn re-reads everything it uses).
func (p *poolDB) InTx(ctx context.Context, fn func(tx sqlstore.DB) error) error {
	var err error
	for range maxTxAttempts {
		err = pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			return fn(&txDB{tx: tx})
		})
		if err == nil || !isRetryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// txDB is sqlstore.DB inside a transaction.
type txDB struct{ tx pgx.Tx }

func (t *txDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return execOn(ctx, t.tx, query, args)
}

func (t *txDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	return queryOn(ctx, t.tx, query, args)
}

func (t *txDB) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return row{t.tx.QueryRow(ctx, query, args...)}
}

func (t *txDB) InTx(_ context.Context, fn func(tx sqlstore.DB) error) error { return fn(t) }

type row struct{ r pgx.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}
