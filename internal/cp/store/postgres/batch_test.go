package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Tests of the group commit (taskBatcher). The pgtest server is shared with
// the external tests' TestMain (postgres_test.go).

var testResult = json.RawMessage(`{"status":"succeeded"}`)

// groupStore opens a store on a fresh database with hosts n0..n(nodes-1),
// each with perNode queued tasks "t<node>-<i>" (oldest first).
func groupStore(t *testing.T, nodes, perNode int) (*Store, time.Time) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, pgtest.Default(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	now := time.Now().Truncate(time.Millisecond)
	var ts []store.Task
	for n := range nodes {
		node := fmt.Sprintf("n%d", n)
		if err := s.CreateHost(ctx, store.Host{ID: node, Enabled: true}); err != nil {
			t.Fatal(err)
		}
		for i := range perNode {
			ts = append(ts, store.Task{ID: fmt.Sprintf("t%d-%d", n, i), NodeID: node, Type: "x",
				CreatedAt: now.Add(time.Duration(i) * time.Millisecond), ExpiresAt: now.Add(time.Hour)})
		}
	}
	if err := s.InsertTasks(ctx, ts); err != nil {
		t.Fatal(err)
	}
	return s, now
}

func claimReq(node string, now time.Time) *taskReq {
	return &taskReq{ctx: context.Background(), claim: true, nodeID: node, now: now.UnixMilli(),
		lease: now.Add(time.Minute).UnixMilli()}
}

func resultReq(node, task, hash string, at time.Time) *taskReq {
	return &taskReq{ctx: context.Background(), nodeID: node, taskID: task, state: string(api.TaskSucceeded),
		result: string(testResult), hash: hash, at: at.UnixMilli()}
}

func getTask(t *testing.T, s *Store, id string) store.Task {
	t.Helper()
	got, err := s.GetTask(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestGroupClaims: one group claims each node's oldest task, leaves a
// second claim of a node out, claims nothing for a disabled host or a node
// without tasks, and applies the lease of the task's type.
func TestGroupClaims(t *testing.T) {
	ctx := context.Background()
	s, now := groupStore(t, 6, 2)
	if _, err := s.UpdateHost(ctx, "n5", func(h *store.Host) error { h.Enabled = false; return nil }); err != nil {
		t.Fatal(err)
	}
	b := &taskBatcher{pool: s.pool}
	typed := claimReq("n1", now)
	typed.byType = map[string]time.Time{"x": now.Add(time.Hour), "y": now.Add(time.Second)}
	batch := []*taskReq{claimReq("n0", now), typed, claimReq("n2", now), claimReq("n3", now), claimReq("n4", now),
		claimReq("n0", now), claimReq("n5", now), claimReq("nobody", now)}
	b.flush(batch)
	for i, r := range batch[:5] {
		want := fmt.Sprintf("t%d-0", i)
		if r.err != nil || r.skipped || !r.ok || r.task.ID != want || r.task.NodeID != r.nodeID ||
			r.task.State != api.TaskDispatched || r.task.Attempts != 1 {
			t.Errorf("claim %d: ok=%v skipped=%v err=%v task=%+v; want %s dispatched", i, r.ok, r.skipped, r.err, r.task, want)
		}
	}
	if !batch[1].task.LeaseExpiresAt.Equal(now.Add(time.Hour)) || !batch[0].task.LeaseExpiresAt.Equal(now.Add(time.Minute)) {
		t.Errorf("leases %v, %v; want the type's, then the default", batch[1].task.LeaseExpiresAt, batch[0].task.LeaseExpiresAt)
	}
	if r := batch[5]; !r.skipped || r.ok || r.err != nil {
		t.Errorf("second claim of n0: ok=%v skipped=%v err=%v; want skipped", r.ok, r.skipped, r.err)
	}
	for _, r := range batch[6:] {
		if r.ok || r.skipped || r.err != nil {
			t.Errorf("claim of %s: ok=%v skipped=%v err=%v; want nothing claimed", r.nodeID, r.ok, r.skipped, r.err)
		}
	}
	if got := getTask(t, s, "t5-0"); got.State != api.TaskQueued {
		t.Errorf("disabled host's task is %s", got.State)
	}
	// The skipped claim, through the public path, takes n0's next task.
	got, ok, err := s.ClaimTask(ctx, "n0", now, now.Add(time.Minute))
	if err != nil || !ok || got.ID != "t0-1" {
		t.Errorf("claim n0 again: %v %v %v; want t0-1", got.ID, ok, err)
	}
}

// TestGroupClaimsMany: in one group each claim takes up to its own max of
// its node's oldest tasks, oldest first, with the lease of each task's
// type; a node with fewer tasks gets what it has.
func TestGroupClaimsMany(t *testing.T) {
	s, now := groupStore(t, 4, 5)
	b := &taskBatcher{pool: s.pool}
	reqs := []*taskReq{claimReq("n0", now), claimReq("n1", now), claimReq("n2", now), claimReq("n3", now)}
	for i, max := range []int{3, 0, 5, 9} {
		reqs[i].max = max
	}
	reqs[2].byType = map[string]time.Time{"x": now.Add(time.Hour)}
	b.flush(reqs)
	for i, want := range [][]string{{"t0-0", "t0-1", "t0-2"}, {"t1-0"}, {"t2-0", "t2-1", "t2-2", "t2-3", "t2-4"},
		{"t3-0", "t3-1", "t3-2", "t3-3", "t3-4"}} {
		r := reqs[i]
		var ids []string
		for _, task := range r.tasks {
			ids = append(ids, task.ID)
			lease := now.Add(time.Minute)
			if i == 2 {
				lease = now.Add(time.Hour)
			}
			if task.NodeID != r.nodeID || task.State != api.TaskDispatched || !task.LeaseExpiresAt.Equal(lease) {
				t.Errorf("claim %d: task %+v", i, task)
			}
			if got := getTask(t, s, task.ID); got.State != api.TaskDispatched {
				t.Errorf("task %s stored as %s", task.ID, got.State)
			}
		}
		if r.err != nil || r.skipped || !r.ok || !slices.Equal(ids, want) || r.task.ID != want[0] {
			t.Errorf("claim %d (max %d): ok=%v skipped=%v err=%v tasks=%v; want %v", i, r.max, r.ok, r.skipped, r.err, ids, want)
		}
	}
	if got := getTask(t, s, "t0-3"); got.State != api.TaskQueued {
		t.Errorf("t0-3 is %s: claimed past max", got.State)
	}
}

// TestGroupResults: results of many nodes in one group are applied; a
// duplicate in the same group is left out and then answered as a replay
// (or a conflict with another hash); a result for another node's task or an
// unknown task is not applied and does not affect the others; a result left
// out because another node's claim to its task came first in the group is
// applied by the single path afterwards.
func TestGroupResults(t *testing.T) {
	ctx := context.Background()
	const nodes = 10
	s, now := groupStore(t, nodes, 1)
	for n := range nodes {
		if _, ok, err := s.ClaimTask(ctx, fmt.Sprintf("n%d", n), now, now.Add(time.Minute)); err != nil || !ok {
			t.Fatalf("claim n%d: %v %v", n, ok, err)
		}
	}
	b := &taskBatcher{pool: s.pool}
	// n9's task: first another node's result, then n9's own (left out).
	wrong, own := resultReq("n2", "t9-0", "x", now), resultReq("n9", "t9-0", "h", now)
	batch := []*taskReq{wrong}
	for n := range nodes - 1 {
		batch = append(batch, resultReq(fmt.Sprintf("n%d", n), fmt.Sprintf("t%d-0", n), "h", now))
	}
	dup, other := resultReq("n0", "t0-0", "h", now), resultReq("n0", "t0-0", "other", now)
	unknown := resultReq("n1", "nope", "h", now)
	batch = append(batch, dup, own, other, unknown)
	b.flush(batch)
	for i, r := range batch[1:nodes] {
		if r.err != nil || !r.ok || r.task.ID != r.taskID || r.task.State != api.TaskSucceeded || r.task.ResultHash != "h" {
			t.Errorf("result %d: ok=%v err=%v task=%+v", i, r.ok, r.err, r.task)
		}
	}
	for _, r := range []*taskReq{dup, other, own} {
		if !r.skipped || r.ok || r.err != nil {
			t.Errorf("duplicate %s/%s: ok=%v skipped=%v err=%v; want skipped", r.taskID, r.hash, r.ok, r.skipped, r.err)
		}
	}
	for _, r := range []*taskReq{wrong, unknown} {
		if r.ok || r.skipped || r.err != nil {
			t.Errorf("result %s of %s: ok=%v skipped=%v err=%v; want not applied", r.taskID, r.nodeID, r.ok, r.skipped, r.err)
		}
	}
	if got := getTask(t, s, "t9-0"); got.State != api.TaskDispatched {
		t.Errorf("t9-0 is %s after another node's result; want dispatched", got.State)
	}
	// What CompleteTask answers for those afterwards: the single path.
	first := batch[1].task
	if got, err := s.CompleteTask(ctx, "n0", "t0-0", api.TaskSucceeded, testResult, "h", now.Add(time.Second), nil); err != nil ||
		!got.FinishedAt.Equal(first.FinishedAt) {
		t.Errorf("replay: %+v, %v; want the stored task", got, err)
	}
	if _, err := s.CompleteTask(ctx, "n0", "t0-0", api.TaskSucceeded, testResult, "other", now, nil); !errors.Is(err, store.ErrConflict) {
		t.Errorf("other result: %v; want ErrConflict", err)
	}
	if _, err := s.CompleteTask(ctx, "n2", "t9-0", api.TaskSucceeded, testResult, "x", now, nil); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another node's task: %v; want ErrNotFound", err)
	}
	if _, err := s.CompleteTask(ctx, "n1", "nope", api.TaskSucceeded, testResult, "h", now, nil); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown task: %v; want ErrNotFound", err)
	}
	if got, err := s.CompleteTask(ctx, "n9", "t9-0", api.TaskSucceeded, testResult, "h", now, nil); err != nil ||
		got.State != api.TaskSucceeded || got.ResultHash != "h" {
		t.Errorf("n9's own result after the group: %+v, %v", got, err)
	}
}

// TestGroupFailure: when the group's transaction fails, in either of its
// two statements, every request gets the error and nothing of the group is
// applied; run again, each request is applied once.
func TestGroupFailure(t *testing.T) {
	ctx := context.Background()
	for _, failing := range []string{"result", "claim"} {
		t.Run(failing, func(t *testing.T) {
			s, now := groupStore(t, 4, 2)
			for n := range 3 {
				if _, ok, err := s.ClaimTask(ctx, fmt.Sprintf("n%d", n), now, now.Add(time.Minute)); err != nil || !ok {
					t.Fatalf("claim n%d: %v %v", n, ok, err)
				}
			}
			// A trigger fails the update of one task: t2-0's result, or the
			// claim of n3's first task.
			bad := map[string]string{"result": "t2-0", "claim": "t3-0"}[failing]
			if _, err := s.pool.Exec(ctx, `CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS
				$$ BEGIN RAISE EXCEPTION 'boom %', NEW.id; END $$`); err != nil {
				t.Fatal(err)
			}
			if _, err := s.pool.Exec(ctx, `CREATE TRIGGER boom BEFORE UPDATE ON tasks FOR EACH ROW
				WHEN (NEW.id = '`+bad+`') EXECUTE FUNCTION boom()`); err != nil {
				t.Fatal(err)
			}
			mk := func() []*taskReq {
				return []*taskReq{resultReq("n0", "t0-0", "h", now), resultReq("n1", "t1-0", "h", now),
					resultReq("n2", "t2-0", "h", now), claimReq("n3", now), claimReq("n0", now)}
			}
			b := &taskBatcher{pool: s.pool}
			batch := mk()
			b.flush(batch)
			for _, r := range batch {
				if r.err == nil || r.ok {
					t.Errorf("%s %s of %s: ok=%v err=%v; want the group's error", map[bool]string{true: "claim", false: "result"}[r.claim],
						r.taskID, r.nodeID, r.ok, r.err)
				}
			}
			for id, want := range map[string]api.TaskState{"t0-0": api.TaskDispatched, "t1-0": api.TaskDispatched,
				"t2-0": api.TaskDispatched, "t3-0": api.TaskQueued, "t0-1": api.TaskQueued} {
				if got := getTask(t, s, id); got.State != want || got.Attempts > 1 {
					t.Errorf("after the failed group %s is %s (attempts %d); want %s", id, got.State, got.Attempts, want)
				}
			}
			if _, err := s.pool.Exec(ctx, `DROP TRIGGER boom ON tasks`); err != nil {
				t.Fatal(err)
			}
			batch = mk()
			b.flush(batch)
			for _, r := range batch {
				if r.err != nil || !r.ok {
					t.Errorf("retry of %s %s: ok=%v err=%v", r.nodeID, r.taskID, r.ok, r.err)
				}
			}
			for id, want := range map[string]api.TaskState{"t0-0": api.TaskSucceeded, "t1-0": api.TaskSucceeded,
				"t2-0": api.TaskSucceeded, "t3-0": api.TaskDispatched, "t0-1": api.TaskDispatched} {
				if got := getTask(t, s, id); got.State != want || got.Attempts != 1 {
					t.Errorf("after the retry %s is %s (attempts %d); want %s, 1 attempt", id, got.State, got.Attempts, want)
				}
			}
		})
	}
}

// TestGroupCanceled: a request whose context ended before its group is
// answered with that error and not run; a request left alone in its group
// while one node is active is handed back to its caller (skipped).
func TestGroupCanceled(t *testing.T) {
	s, now := groupStore(t, 2, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, lone := claimReq("n0", now), claimReq("n1", now)
	r.ctx = ctx
	(&taskBatcher{pool: s.pool, alone: true}).flush([]*taskReq{r, lone})
	if !errors.Is(r.err, context.Canceled) || r.ok || r.skipped {
		t.Errorf("canceled claim: ok=%v skipped=%v err=%v", r.ok, r.skipped, r.err)
	}
	if lone.err != nil || lone.ok || !lone.skipped {
		t.Errorf("lone claim: ok=%v skipped=%v err=%v; want skipped", lone.ok, lone.skipped, lone.err)
	}
	for _, id := range []string{"t0-0", "t1-0"} {
		if got := getTask(t, s, id); got.State != api.TaskQueued {
			t.Errorf("%s is %s; want queued", id, got.State)
		}
	}
}

// TestGroupConcurrent: many nodes claim (one task at a time, and up to 3)
// and post results at once through the public methods, each result posted
// twice at the same time and once by another node: every task is claimed
// once and finished once, the replay gets the same task, the other node
// gets ErrNotFound.
func TestGroupConcurrent(t *testing.T) {
	for _, max := range []int{1, 3} {
		t.Run(fmt.Sprintf("max %d", max), func(t *testing.T) { testGroupConcurrent(t, max) })
	}
}

func testGroupConcurrent(t *testing.T, max int) {
	ctx := context.Background()
	const nodes, perNode = 24, 5
	s, now := groupStore(t, nodes, perNode)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := map[string]int{}
	leases := store.ClaimLeases{Default: now.Add(time.Minute)}
	for n := range nodes {
		node := fmt.Sprintf("n%d", n)
		wg.Go(func() {
			for {
				claimed, err := s.ClaimTasks(ctx, node, now, leases, max, nil)
				if err != nil || len(claimed) == 0 {
					if err != nil {
						t.Error(err)
					}
					return
				}
				if len(claimed) > max {
					t.Errorf("%s claimed %d tasks, asked for %d", node, len(claimed), max)
				}
				for _, task := range claimed {
					if task.NodeID != node {
						t.Errorf("%s claimed %s of %s", node, task.ID, task.NodeID)
					}
					var inner sync.WaitGroup
					got := make([]store.Task, 2)
					errs := make([]error, 3)
					for i := range 2 {
						inner.Go(func() {
							got[i], errs[i] = s.CompleteTask(ctx, node, task.ID, api.TaskSucceeded, testResult, "h", time.Now(), nil)
						})
					}
					inner.Go(func() {
						other := fmt.Sprintf("n%d", (n+1)%nodes)
						_, errs[2] = s.CompleteTask(ctx, other, task.ID, api.TaskFailed, testResult, "x", time.Now(), nil)
					})
					inner.Wait()
					if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], store.ErrNotFound) {
						t.Errorf("results of %s: %v", task.ID, errs)
					}
					if got[0].FinishedAt != got[1].FinishedAt || got[0].State != api.TaskSucceeded {
						t.Errorf("results of %s answered %+v and %+v; want the same finished task", task.ID, got[0], got[1])
					}
					mu.Lock()
					done[task.ID]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(done) != nodes*perNode {
		t.Errorf("%d tasks done, want %d", len(done), nodes*perNode)
	}
	tasks, err := s.ListTasks(ctx, store.TaskFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if done[task.ID] != 1 || task.State != api.TaskSucceeded || task.Attempts != 1 || task.ResultHash != "h" {
			t.Errorf("%s: done %d times, %s, %d attempts, hash %q", task.ID, done[task.ID], task.State, task.Attempts, task.ResultHash)
		}
	}
}

// TestResultsStatementUsesPrimaryKey: the results' group statement reads
// the tasks through their primary key, not every unfinished task, on a
// fresh queue without table statistics, in the generic plan a prepared
// statement settles on. (Without completeBatchSQL's redundant
// "id = ANY($1)" PostgreSQL 15 here still picks the primary key: the plan
// that read the whole state index did not come back.)
func TestResultsStatementUsesPrimaryKey(t *testing.T) {
	s, now := groupStore(t, 4, 2500)
	st := resultsStmt([]*taskReq{resultReq("n0", "t0-0", "h0", now), resultReq("n1", "t1-0", "h1", now)})
	ctx := context.Background()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The plan a prepared statement settles on after a few runs: one for
	// any parameters, where unnest is guessed at 100 rows.
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, "RESET plan_cache_mode") }()
	if _, err := conn.Exec(ctx, "PREPARE results_plan AS "+st.sql); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE results_plan") }()
	// EXECUTE takes values, not parameters.
	lits := make([]string, len(st.args))
	for i, a := range st.args {
		switch v := a.(type) {
		case []string:
			lits[i] = "ARRAY['" + strings.Join(v, "','") + "']"
		case []int64:
			lits[i] = strings.Trim(strings.Join(strings.Fields(fmt.Sprint(v)), ","), "[]")
			lits[i] = "ARRAY[" + lits[i] + "]"
		default:
			t.Fatalf("argument %d: %T", i, a)
		}
	}
	rows, err := conn.Query(ctx, "EXPLAIN EXECUTE results_plan("+strings.Join(lits, ", ")+")")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "tasks_pkey") || strings.Contains(text, "Seq Scan on tasks") ||
		strings.Contains(text, "tasks_state") {
		t.Errorf("the results statement does not read tasks by primary key:\n%s", text)
	}
}
