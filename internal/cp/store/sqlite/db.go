package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// poolDB is sqlstore.DB over the writer and reader pools.
type poolDB struct {
	w, r *sql.DB
	hub  *sqlstore.Broadcaster
}

// pick routes a statement: read-only SELECTs to the reader pool, everything
// else (including UPDATE ... RETURNING) to the writer.
func (p *poolDB) pick(query string) *sql.DB {
	q := strings.TrimLeft(query, " \t\r\n")
	if len(q) >= 6 && strings.EqualFold(q[:6], "SELECT") {
		return p.r
	}
	return p.w
}

func (p *poolDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return execOn(ctx, p.w, query, args)
}

func (p *poolDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	return queryOn(ctx, p.pick(query), query, args)
}

func (p *poolDB) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return row{p.pick(query).QueryRowContext(ctx, query, args...)}
}

// InTx runs fn in a BEGIN IMMEDIATE transaction on the writer and publishes
// the events fn queued once the commit succeeded.
func (p *poolDB) InTx(ctx context.Context, fn func(tx sqlstore.DB) error) error {
	tx, err := p.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	t := &txDB{tx: tx}
	if err := fn(t); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	for _, ev := range t.pending {
		p.hub.Publish(ev)
	}
	return nil
}

// notify is the Dialect.Notify hook: queue on the transaction, or publish at
// once for a statement that ran outside one (it has committed already).
func (p *poolDB) notify(_ context.Context, tx sqlstore.DB, ev store.Event) error {
	if t, ok := tx.(*txDB); ok {
		t.pending = append(t.pending, ev)
		return nil
	}
	p.hub.Publish(ev)
	return nil
}

// txDB is sqlstore.DB inside a transaction.
type txDB struct {
	tx      *sql.Tx
	pending []store.Event
}

type execQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (t *txDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return execOn(ctx, t.tx, query, args)
}

func (t *txDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	return queryOn(ctx, t.tx, query, args)
}

func (t *txDB) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return row{t.tx.QueryRowContext(ctx, query, args...)}
}

func (t *txDB) InTx(_ context.Context, fn func(tx sqlstore.DB) error) error { return fn(t) }

func execOn(ctx context.Context, q execQuerier, query string, args []any) (int64, error) {
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func queryOn(ctx context.Context, q execQuerier, query string, args []any) (sqlstore.Rows, error) {
	r, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

type rows struct{ *sql.Rows }

func (r rows) Close() { _ = r.Rows.Close() }

type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}
