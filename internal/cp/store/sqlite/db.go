package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// poolDB is sqlstore.DB over the writer and reader pools, each with its
// statement cache (the same pool and cache twice for an in-memory
// database).
type poolDB struct {
	w, r   *sql.DB
	ws, rs *stmtCache
	hub    *sqlstore.Broadcaster
	// g runs the writes (InTx, and Exec and QueryRow of statements that
	// are not SELECTs) in group commits.
	g *groupWriter
}

func newPoolDB(w, r *sql.DB, hub *sqlstore.Broadcaster) *poolDB {
	p := &poolDB{w: w, r: r, ws: newStmtCache(w), hub: hub}
	p.rs = p.ws
	if r != w {
		p.rs = newStmtCache(r)
	}
	p.g = newGroupWriter(p)
	return p
}

// isSelect says whether a statement is a read-only SELECT.
func isSelect(query string) bool {
	q := strings.TrimLeft(query, " \t\r\n")
	return len(q) >= 6 && strings.EqualFold(q[:6], "SELECT")
}

// pick routes a statement: read-only SELECTs to the reader pool, everything
// else (including UPDATE ... RETURNING) to the writer.
func (p *poolDB) pick(query string) *stmtCache {
	if isSelect(query) {
		return p.rs
	}
	return p.ws
}

// close stops the group writer and closes the cached statements.
func (p *poolDB) close() error {
	p.g.close()
	err := p.ws.close()
	if p.rs != p.ws {
		err = errors.Join(err, p.rs.close())
	}
	return err
}

// Exec runs the statement as a write of its own in the next group commit.
func (p *poolDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := p.g.do(ctx, func(tx sqlstore.DB) error {
		var err error
		n, err = tx.Exec(ctx, query, args...)
		return err
	})
	return n, err
}

func (p *poolDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	c := p.pick(query)
	if st := c.get(ctx, query); st != nil {
		return wrapRows(st.QueryContext(ctx, args...))
	}
	return queryOn(ctx, c.db, query, args)
}

// QueryRow runs a SELECT on the reader pool; any other statement (UPDATE
// ... RETURNING) runs when its row is scanned, as a write of its own in the
// next group commit, so a write that returns no row, or whose row does not
// scan, is rolled back.
func (p *poolDB) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	if !isSelect(query) {
		return writeRow{p: p, ctx: ctx, query: query, args: args}
	}
	if st := p.rs.get(ctx, query); st != nil {
		return row{st.QueryRowContext(ctx, args...)}
	}
	return row{p.r.QueryRowContext(ctx, query, args...)}
}

// writeRow is QueryRow of a write.
type writeRow struct {
	p     *poolDB
	ctx   context.Context
	query string
	args  []any
}

func (w writeRow) Scan(dest ...any) error {
	return w.p.g.do(w.ctx, func(tx sqlstore.DB) error {
		return tx.QueryRow(w.ctx, w.query, w.args...).Scan(dest...)
	})
}

// InTx runs fn as one write in the next group commit (a BEGIN IMMEDIATE
// transaction on the writer, fn inside its own savepoint when the group has
// other writes) and returns once that has committed, or fn's error once its
// writes are rolled back; the events fn queued are published after the
// commit.
func (p *poolDB) InTx(ctx context.Context, fn func(tx sqlstore.DB) error) error {
	return p.g.do(ctx, fn)
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

// txDB is sqlstore.DB inside a group commit's transaction. Every statement
// runs on the writer's connection; a cached one is bound to the transaction
// (Tx.StmtContext reuses the connection's prepared copy). Statements ignore
// their context's cancellation: SQLite interrupting one would roll back the
// whole group (see groupWriter).
type txDB struct {
	tx      *sql.Tx
	stmts   *stmtCache
	pending []store.Event
}

// stmt is query's cached statement bound to the transaction, or nil (and
// the text is remembered for preparing after the transaction).
func (t *txDB) stmt(ctx context.Context, query string) *sql.Stmt {
	st := t.stmts.lookup(query)
	if st == nil {
		t.stmts.miss(query)
		return nil
	}
	return t.tx.StmtContext(ctx, st)
}

type execQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (t *txDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	ctx = context.WithoutCancel(ctx)
	if st := t.stmt(ctx, query); st != nil {
		return result(st.ExecContext(ctx, args...))
	}
	return execOn(ctx, t.tx, query, args)
}

func (t *txDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	ctx = context.WithoutCancel(ctx)
	if st := t.stmt(ctx, query); st != nil {
		return wrapRows(st.QueryContext(ctx, args...))
	}
	return queryOn(ctx, t.tx, query, args)
}

func (t *txDB) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	ctx = context.WithoutCancel(ctx)
	if st := t.stmt(ctx, query); st != nil {
		return row{st.QueryRowContext(ctx, args...)}
	}
	return row{t.tx.QueryRowContext(ctx, query, args...)}
}

func (t *txDB) InTx(_ context.Context, fn func(tx sqlstore.DB) error) error { return fn(t) }

func execOn(ctx context.Context, q execQuerier, query string, args []any) (int64, error) {
	return result(q.ExecContext(ctx, query, args...))
}

func queryOn(ctx context.Context, q execQuerier, query string, args []any) (sqlstore.Rows, error) {
	return wrapRows(q.QueryContext(ctx, query, args...))
}

func result(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func wrapRows(r *sql.Rows, err error) (sqlstore.Rows, error) {
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
