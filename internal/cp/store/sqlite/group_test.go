package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
	"github.com/drover-dev/drover/internal/wire/api"
)

func openTest(t *testing.T) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "drover.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

const insTask = `INSERT INTO tasks (id, node_id, type, params, state, correlation_id, created_by, attempts,
	created_at, expires_at, dispatched_at, lease_expires_at, finished_at, result, result_hash)
	VALUES ($1, $2, 'x', '{}', 'queued', '', '', 0, $3, $4, 0, 0, 0, '', '')`

// TestGroupCommit: writes from many goroutines share group commits; a
// write that fails or panics is rolled back alone (its rows absent, its
// events unpublished, the panic raised in its caller) while the others in
// its group commit; a write whose context ended before it ran is not run.
func TestGroupCommit(t *testing.T) {
	s := openTest(t)
	p := s.db
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	events, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour).UnixMilli()
	const n = 120
	errBoom := errors.New("boom")
	var wg sync.WaitGroup
	results := make([]error, n)
	panics := make([]any, n)
	for i := range n {
		wg.Go(func() {
			defer func() { panics[i] = recover() }()
			id := fmt.Sprintf("t%03d", i)
			results[i] = p.InTx(ctx, func(tx sqlstore.DB) error {
				if _, err := tx.Exec(ctx, insTask, id, "n1", int64(i), far); err != nil {
					return err
				}
				if err := s.db.notify(ctx, tx, store.Event{Kind: store.EventTask, ID: id}); err != nil {
					return err
				}
				switch i % 10 {
				case 3:
					return errBoom
				case 7:
					panic("write " + id)
				}
				return nil
			})
		})
	}
	wg.Wait()
	var want []string
	for i := range n {
		id := fmt.Sprintf("t%03d", i)
		switch i % 10 {
		case 3:
			if !errors.Is(results[i], errBoom) {
				t.Errorf("%s: err %v, want boom", id, results[i])
			}
		case 7:
			if panics[i] != "write "+id {
				t.Errorf("%s: panic %v, want it raised in the caller", id, panics[i])
			}
		default:
			if results[i] != nil || panics[i] != nil {
				t.Errorf("%s: %v %v", id, results[i], panics[i])
			}
			want = append(want, id)
		}
	}
	rows, err := p.Query(ctx, `SELECT id FROM tasks ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	rows.Close()
	if !slices.Equal(got, want) {
		t.Errorf("committed rows %v\nwant %v", got, want)
	}
	var evs []string
	for len(evs) < len(want) {
		select {
		case ev := <-events:
			evs = append(evs, ev.ID)
		case <-ctx.Done():
			t.Fatalf("events %v, want %d", evs, len(want))
		}
	}
	select {
	case ev := <-events:
		t.Errorf("event of a rolled-back write: %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
	slices.Sort(evs)
	if !slices.Equal(evs, want) {
		t.Errorf("events %v\nwant %v", evs, want)
	}

	// A write whose context has ended is not run.
	done, stop := context.WithCancel(ctx)
	stop()
	if _, err := p.Exec(done, insTask, "late", "n1", 1, far); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled write: %v", err)
	}
	var c int
	if err := p.QueryRow(ctx, `SELECT COUNT(*) FROM tasks WHERE id = 'late'`).Scan(&c); err != nil || c != 0 {
		t.Errorf("canceled write ran: %d %v", c, err)
	}

	// After Close, writes are refused.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, insTask, "closed", "n1", 1, far); !errors.Is(err, errClosed) {
		t.Errorf("write after close: %v", err)
	}
}

// TestGroupClaimAndResult: concurrent claims of one node's queued tasks,
// sharing group commits, hand out each task once and in queue order per
// claimer; another node claims none of them; results replayed concurrently
// are applied once (one finish time, the same task back to every replay),
// a different result and another node's result are refused.
func TestGroupClaimAndResult(t *testing.T) {
	s := openTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	now := time.Now()
	const n = 200
	var ts []store.Task
	for i := range n {
		ts = append(ts, store.Task{ID: fmt.Sprintf("t%03d", i), NodeID: "n1", Type: "x",
			CreatedAt: now.Add(time.Duration(i) * time.Millisecond), ExpiresAt: now.Add(time.Hour)})
	}
	if err := s.InsertTasks(ctx, ts); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		wg      sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			last := ""
			for {
				task, ok, err := s.ClaimTask(ctx, "n1", now, now.Add(time.Minute))
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					return
				}
				if task.ID <= last {
					t.Errorf("claimed %s after %s", task.ID, last)
				}
				last = task.ID
				mu.Lock()
				claimed[task.ID]++
				mu.Unlock()
			}
		})
		wg.Go(func() {
			if task, ok, err := s.ClaimTask(ctx, "n2", now, now.Add(time.Minute)); ok || err != nil {
				t.Errorf("node n2 claimed %+v, %v", task, err)
			}
		})
	}
	wg.Wait()
	if len(claimed) != n {
		t.Fatalf("%d tasks claimed, want %d", len(claimed), n)
	}
	for id, c := range claimed {
		if c != 1 {
			t.Errorf("%s claimed %d times", id, c)
		}
	}

	res := []byte(`{"status":"succeeded"}`)
	finished := make([]time.Time, 10)
	for i := range finished {
		wg.Go(func() {
			got, err := s.CompleteTask(ctx, "n1", "t000", api.TaskSucceeded, res, "h1", now.Add(time.Duration(i+1)*time.Second), nil)
			if err != nil || got.State != api.TaskSucceeded || got.ResultHash != "h1" {
				t.Errorf("replay %d: %+v %v", i, got, err)
			}
			finished[i] = got.FinishedAt
		})
	}
	wg.Wait()
	for _, f := range finished {
		if !f.Equal(finished[0]) {
			t.Fatalf("result applied more than once: finish times %v", finished)
		}
	}
	if _, err := s.CompleteTask(ctx, "n1", "t000", api.TaskFailed, res, "h2", now, nil); !errors.Is(err, store.ErrConflict) {
		t.Errorf("another result: %v, want conflict", err)
	}
	if _, err := s.CompleteTask(ctx, "n2", "t001", api.TaskSucceeded, res, "h1", now, nil); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another node's result: %v, want not found", err)
	}
	if got, err := s.GetTask(ctx, "t001"); err != nil || got.State != api.TaskDispatched {
		t.Errorf("t001 after the refused result: %+v %v", got, err)
	}
}

// TestEmptyClaimSkipsWriter: a claim that finds no queued task is answered
// by a reader while the writer is busy (a long-poll of an idle node never
// waits for, or delays, the writer); a claim that finds one takes it
// through the writer once the writer is free.
func TestEmptyClaimSkipsWriter(t *testing.T) {
	s := openTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	now := time.Now()
	if err := s.InsertTasks(ctx, []store.Task{{ID: "t1", NodeID: "busy", Type: "x", CreatedAt: now,
		ExpiresAt: now.Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	inWriter, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- s.db.InTx(ctx, func(sqlstore.DB) error { close(inWriter); <-release; return nil })
	}()
	<-inWriter
	claimed := make(chan store.Task, 1)
	go func() {
		task, ok, err := s.ClaimTask(ctx, "busy", now, now.Add(time.Minute))
		if err != nil || !ok {
			t.Errorf("claim of a queued task: %v, %v", ok, err)
		}
		claimed <- task
	}()
	idle := make(chan error, 1)
	go func() {
		task, ok, err := s.ClaimTask(ctx, "idle", now, now.Add(time.Minute))
		if ok {
			err = fmt.Errorf("claimed %s", task.ID)
		}
		idle <- err
	}()
	select {
	case err := <-idle:
		if err != nil {
			close(release)
			t.Fatalf("claim for a node with no task while the writer is busy: %v", err)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a claim for a node with no task waited for the busy writer")
	}
	select {
	case task := <-claimed:
		close(release)
		t.Fatalf("claimed %s while the writer was held", task.ID)
	default:
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if task := <-claimed; task.ID != "t1" || task.State != api.TaskDispatched {
		t.Fatalf("claimed %+v, want t1 dispatched", task)
	}
}
