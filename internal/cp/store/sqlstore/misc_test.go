package sqlstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/store"
)

// TestAuditInsertRows: the statement for one record is auditInsert, and
// each further record takes the next ten placeholders.
func TestAuditInsertRows(t *testing.T) {
	if got := auditInsertRows(1); got != auditInsert {
		t.Errorf("one record:\n%s\nwant\n%s", got, auditInsert)
	}
	want := `INSERT INTO audit (id, at, actor, actor_token_id, actor_role, action, target, result, correlation_id, detail) VALUES ` +
		`($1, $2, $3, $4, $5, $6, $7, $8, $9, $10), ($11, $12, $13, $14, $15, $16, $17, $18, $19, $20)`
	if got := auditInsertRows(2); got != want {
		t.Errorf("two records:\n%s\nwant\n%s", got, want)
	}
}

// collidingDB answers each audit insert as a database would whose table
// already holds the ids listed in taken: those rows are skipped, the
// others returned.
type collidingDB struct {
	DB
	taken   func(id int64) bool
	inserts [][]any // each statement's args
}

func (c *collidingDB) Query(_ context.Context, q string, args ...any) (Rows, error) {
	if !strings.HasPrefix(q, "INSERT INTO audit") || !strings.HasSuffix(q, "ON CONFLICT (id) DO NOTHING RETURNING id") {
		return nil, errors.New("unexpected statement: " + q)
	}
	c.inserts = append(c.inserts, args)
	var ids []int64
	for i := 0; i < len(args); i += auditCols {
		if id := args[i].(int64); !c.taken(id) {
			ids = append(ids, id)
		}
	}
	return &idRows{ids: ids, at: -1}, nil
}

type idRows struct {
	ids []int64
	at  int
}

func (r *idRows) Next() bool             { r.at++; return r.at < len(r.ids) }
func (r *idRows) Scan(dest ...any) error { *dest[0].(*int64) = r.ids[r.at]; return nil }
func (r *idRows) Err() error             { return nil }
func (r *idRows) Close()                 {}

// TestAppendAuditsCollision: in a transaction, a record whose id another
// replica's clock already gave is skipped by the insert (which must not
// fail there) and inserted again under a new id; the others are not
// repeated.
// Ids that keep colliding end in an error naming how many records.
func TestAppendAuditsCollision(t *testing.T) {
	var asked []int64
	db := &collidingDB{}
	db.taken = func(id int64) bool {
		asked = append(asked, id)
		return len(asked) == 2 // the second record's first id
	}
	s := New(db, Dialect{})
	es := []store.AuditEvent{{Action: "a"}, {Action: "b"}, {Action: "c"}}
	if err := s.appendAuditsTx(t.Context(), db, es); err != nil {
		t.Fatal(err)
	}
	if len(db.inserts) != 2 || len(db.inserts[0]) != 3*auditCols || len(db.inserts[1]) != auditCols {
		t.Fatalf("inserts: %d statements (%v)", len(db.inserts), db.inserts)
	}
	if again := db.inserts[1]; again[5] != "b" || again[0].(int64) <= asked[2] {
		t.Errorf("retried record %v, want action b under a new id", again)
	}

	db = &collidingDB{taken: func(int64) bool { return true }}
	err := s.appendAuditsTx(t.Context(), db, es)
	if err == nil || !strings.Contains(err.Error(), "3 record(s)") || len(db.inserts) != 5 {
		t.Fatalf("ids always taken: %v after %d statements", err, len(db.inserts))
	}
}

// TestAppendAuditsChunked: in a transaction, records go maxAuditRows to a
// statement (a whole fleet's stale records would pass PostgreSQL's
// 65,535 parameters in one), none lost or repeated.
func TestAppendAuditsChunked(t *testing.T) {
	db := &collidingDB{taken: func(int64) bool { return false }}
	es := make([]store.AuditEvent, 2*maxAuditRows+1)
	for i := range es {
		es[i].Action = strconv.Itoa(i)
	}
	if err := New(db, Dialect{}).appendAuditsTx(t.Context(), db, es); err != nil {
		t.Fatal(err)
	}
	var rows []int
	next := 0
	for _, args := range db.inserts {
		rows = append(rows, len(args)/auditCols)
		for i := 0; i < len(args); i += auditCols {
			if args[i+5] != strconv.Itoa(next) {
				t.Fatalf("record %d is %v", next, args[i+5])
			}
			next++
		}
	}
	if want := []int{maxAuditRows, maxAuditRows, 1}; !slices.Equal(rows, want) {
		t.Errorf("rows per statement %v, want %v", rows, want)
	}
	if err := New(db, Dialect{}).appendAuditsTx(t.Context(), db, nil); err != nil || len(db.inserts) != 3 {
		t.Errorf("no records: %v, %d statements in all, want 3", err, len(db.inserts))
	}
}

// refusingDB refuses each audit insert whose ids include a taken one, as
// SQLite does (the statement undone alone, the transaction usable).
type refusingDB struct {
	DB
	taken   func(id int64) bool
	inserts [][]any
}

var errUnique = errors.New("UNIQUE constraint failed: audit.id")

func (r *refusingDB) Exec(_ context.Context, q string, args ...any) (int64, error) {
	if !strings.HasPrefix(q, "INSERT INTO audit") || strings.Contains(q, "ON CONFLICT") {
		return 0, errors.New("unexpected statement: " + q)
	}
	r.inserts = append(r.inserts, args)
	for i := 0; i < len(args); i += auditCols {
		if r.taken(args[i].(int64)) {
			return 0, errUnique
		}
	}
	return int64(len(args) / auditCols), nil
}

// TestAppendAuditsCollisionStatementRollback: where a refused statement
// leaves its transaction usable (SQLite), records go in a plain INSERT
// that is run again under new ids after a collision; ids that keep
// colliding end in an error.
func TestAppendAuditsCollisionStatementRollback(t *testing.T) {
	n := 0
	db := &refusingDB{taken: func(int64) bool { n++; return n == 2 }} // the first statement's second id
	s := New(db, Dialect{StatementRollback: true, IsUniqueViolation: func(err error) bool { return errors.Is(err, errUnique) }})
	es := []store.AuditEvent{{Action: "a"}, {Action: "b"}}
	if err := s.appendAuditsTx(t.Context(), db, es); err != nil {
		t.Fatal(err)
	}
	if len(db.inserts) != 2 || len(db.inserts[1]) != 2*auditCols || db.inserts[1][0].(int64) <= db.inserts[0][auditCols].(int64) {
		t.Fatalf("inserts %v: want the two records again under new ids", db.inserts)
	}
	db = &refusingDB{taken: func(int64) bool { return true }}
	s = New(db, Dialect{StatementRollback: true, IsUniqueViolation: func(err error) bool { return errors.Is(err, errUnique) }})
	if err := s.appendAuditsTx(t.Context(), db, es); !errors.Is(err, errUnique) || len(db.inserts) != 5 {
		t.Fatalf("ids always taken: %v after %d statements", err, len(db.inserts))
	}
}

// oneTxDB is refusingDB that also takes the row inserts of the writes
// that carry records, and runs a transaction as its statements in turn.
type oneTxDB struct {
	*refusingDB
	rows int
}

func (o *oneTxDB) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if strings.HasPrefix(q, "INSERT INTO audit") {
		return o.refusingDB.Exec(ctx, q, args...)
	}
	o.rows++
	return 1, nil
}

func (o *oneTxDB) InTx(_ context.Context, fn func(tx DB) error) error { return fn(o) }

// TestCreateRecordsRefusedIsNoConflict: a creation whose records keep
// colliding with taken ids fails as a failure to write its records, never
// as the row's own conflict (which would tell the operator the host, the
// allocation or the session exists).
func TestCreateRecordsRefusedIsNoConflict(t *testing.T) {
	db := &oneTxDB{refusingDB: &refusingDB{taken: func(int64) bool { return true }}}
	s := New(db, Dialect{StatementRollback: true, IsUniqueViolation: func(err error) bool { return errors.Is(err, errUnique) }})
	rec := store.AuditEvent{Action: "x.create"}
	for what, err := range map[string]error{
		"host":       s.CreateHost(t.Context(), store.Host{ID: "h1"}, rec),
		"allocation": s.CreateAllocation(t.Context(), store.Allocation{ID: "a1", Username: "u", HostID: "h1"}, rec),
		"terminal session": s.CreateTerminalSession(t.Context(), store.TerminalSession{ID: "s1", AllocationID: "a1", TokenHash: "h",
			Mode: terminalModePTY}, rec),
	} {
		if err == nil || errors.Is(err, store.ErrConflict) || !errors.Is(err, errRecords) {
			t.Errorf("%s with its records refused: %v; want errRecords, not ErrConflict", what, err)
		}
	}
	if db.rows != 3 {
		t.Errorf("%d row inserts, want 3", db.rows)
	}
}
