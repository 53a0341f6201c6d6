package sqlite

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestStmtCache: statements run through the pools are cached; one first
// run inside a transaction is cached once the transaction ends, and later
// transactions use it; a text that does not prepare is not cached and
// still reports its error; a full cache runs texts unprepared.
func TestStmtCache(t *testing.T) {
	for _, path := range []string{"file", MemoryPath} {
		t.Run(path, func(t *testing.T) {
			if path == "file" {
				path = filepath.Join(t.TempDir(), "drover.db")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			p := s.db

			const sel = `SELECT COUNT(*) FROM tasks WHERE node_id = $1`
			var n int
			if err := p.QueryRow(ctx, sel, "n1").Scan(&n); err != nil || n != 0 {
				t.Fatalf("count = %d, %v", n, err)
			}
			if p.rs.lookup(sel) == nil {
				t.Errorf("pool SELECT not cached")
			}

			const ins = `INSERT INTO tasks (id, node_id, type, params, state, correlation_id, created_by, attempts,
				created_at, expires_at, dispatched_at, lease_expires_at, finished_at, result, result_hash)
				VALUES ($1, 'n1', 'x', '{}', 'queued', '', '', 0, 1, $2, 0, 0, 0, '', '')`
			far := time.Now().Add(time.Hour).UnixMilli()
			for i, id := range []string{"t1", "t2", "t3"} {
				err := p.InTx(ctx, func(tx sqlstore.DB) error {
					_, err := tx.Exec(ctx, ins, id, far)
					return err
				})
				if err != nil {
					t.Fatalf("insert %s: %v", id, err)
				}
				if p.ws.lookup(ins) == nil {
					t.Fatalf("insert %d: statement run in a transaction not cached after it", i)
				}
			}
			if err := p.InTx(ctx, func(tx sqlstore.DB) error {
				_, err := tx.Exec(ctx, ins, "t1", far)
				return err
			}); err == nil || !isUniqueViolation(err) {
				t.Errorf("duplicate through cached statement: %v, want unique violation", err)
			}
			if err := p.QueryRow(ctx, sel, "n1").Scan(&n); err != nil || n != 3 {
				t.Fatalf("count = %d, %v; want 3", n, err)
			}

			const bad = `SELECT nope FROM tasks`
			if _, err := p.Query(ctx, bad); err == nil {
				t.Errorf("bad SELECT: no error")
			}
			if p.rs.lookup(bad) != nil {
				t.Errorf("bad SELECT cached")
			}

			// The store's own task path over the cache: claim binds to the
			// node, a replayed result is the same task, another is refused.
			now := time.Now()
			got, ok, err := s.ClaimTask(ctx, "n1", now, now.Add(time.Minute))
			if err != nil || !ok || got.ID != "t1" {
				t.Fatalf("claim = %+v %v %v", got, ok, err)
			}
			if _, ok, err := s.ClaimTask(ctx, "n2", now, now.Add(time.Minute)); ok || err != nil {
				t.Fatalf("claim by another node = %v %v", ok, err)
			}
			for range 2 {
				done, err := s.CompleteTask(ctx, "n1", "t1", api.TaskSucceeded, []byte(`{}`), "h", now, nil)
				if err != nil || done.State != api.TaskSucceeded {
					t.Fatalf("complete = %+v %v", done, err)
				}
			}
			if _, err := s.CompleteTask(ctx, "n1", "t1", api.TaskFailed, []byte(`{}`), "h2", now, nil); err == nil {
				t.Errorf("second result with another hash accepted")
			}
			if _, err := s.CompleteTask(ctx, "n2", "t2", api.TaskSucceeded, []byte(`{}`), "h", now, nil); err == nil {
				t.Errorf("result by another node accepted")
			}

			// Full: further texts run unprepared and still work.
			p.rs.mu.Lock()
			for i := len(p.rs.m); i < maxCachedStmts; i++ {
				p.rs.m[string(rune('a'+i%26))+time.Duration(i).String()] = p.rs.m[sel]
			}
			p.rs.mu.Unlock()
			const other = `SELECT COUNT(*) FROM tasks WHERE state = $1`
			if err := p.QueryRow(ctx, other, string(store.Task{}.State)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			p.rs.mu.Lock()
			cached := p.rs.m[other] != nil
			for q, st := range p.rs.m {
				if q != sel && st == p.rs.m[sel] {
					delete(p.rs.m, q) // aliases of sel: close it once
				}
			}
			p.rs.mu.Unlock()
			if cached {
				t.Errorf("full cache took another statement")
			}
		})
	}
}
