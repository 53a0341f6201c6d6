package storetest

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

var taskCases = []testCase{
	{"Task/EnqueueGet", testTaskEnqueueGet},
	{"Task/EnqueueConflict", testTaskEnqueueConflict},
	{"Task/EnqueueNeedsExpiry", testTaskEnqueueNeedsExpiry},
	{"Task/GetNotFound", testTaskNotFound},
	{"Task/EnqueueEvent", testTaskEnqueueEvent},
	{"Task/List", testTaskList},
	{"Task/ClaimOrdering", testClaimOrdering},
	{"Task/ClaimSkipsExpired", testClaimSkipsExpired},
	{"Task/ClaimConcurrent", testClaimConcurrent},
	{"Task/QueuedTaskNodes", testQueuedTaskNodes},
	{"Task/Start", testStartTask},
	{"Task/Complete", testCompleteTask},
	{"Task/CompleteAfterRequeue", testCompleteAfterRequeue},
	{"Task/CompleteRejects", testCompleteRejects},
	{"Task/Cancel", testCancelTask},
	{"Task/Reap", testReapTasks},
	{"Task/Events", testTaskEvents},
	{"Task/EventsConcurrent", testTaskEventsConcurrent},
}

func testTaskEnqueueGet(t *testing.T, s store.Store) {
	in := newTask("t1", "n1", 0)
	// Fields the store owns are reset on enqueue.
	in.State, in.Attempts, in.DispatchedAt, in.Result = api.TaskRunning, 7, at(time.Second), json.RawMessage(`{}`)
	enqueue(t, s, in)
	want := newTask("t1", "n1", 0)
	want.State = api.TaskQueued
	diff(t, "task", getTask(t, s, "t1"), want)
}

func testTaskEnqueueConflict(t *testing.T, s store.Store) {
	enqueue(t, s, newTask("t1", "n1", 0))
	wantErr(t, s.EnqueueTask(ctxT(t), newTask("t1", "n2", 0)), store.ErrConflict)
}

func testTaskEnqueueNeedsExpiry(t *testing.T, s store.Store) {
	task := newTask("t1", "n1", 0)
	task.ExpiresAt = time.Time{}
	if err := s.EnqueueTask(ctxT(t), task); err == nil {
		t.Fatal("EnqueueTask accepted a task without ExpiresAt")
	}
}

func testTaskNotFound(t *testing.T, s store.Store) {
	_, err := s.GetTask(ctxT(t), "nope")
	wantErr(t, err, store.ErrNotFound)
}

func testTaskEnqueueEvent(t *testing.T, s store.Store) {
	ch := subscribe(t, s)
	enqueue(t, s, newTask("t1", "n1", 0))
	waitEvent(t, ch, store.Event{Kind: store.EventTask, ID: "n1"})
	// A failed enqueue publishes nothing.
	_ = s.EnqueueTask(ctxT(t), newTask("t1", "n2", 0))
	noEvent(t, ch, store.Event{Kind: store.EventTask, ID: "n2"}, 200*time.Millisecond)
}

func testTaskList(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	b := newTask("b", "n2", 2*time.Second)
	b.Type = "diag.collect"
	enqueue(t, s,
		newTask("a", "n1", 1*time.Second),
		b,
		newTask("c", "n1", 3*time.Second),
		newTask("d", "n1", 3*time.Second), // same CreatedAt as c: id breaks the tie
	)
	claim(t, s, "n1", 10*time.Second, time.Minute) // a → dispatched
	for _, tc := range []struct {
		f    store.TaskFilter
		want []string
	}{
		{store.TaskFilter{}, []string{"d", "c", "b", "a"}},
		{store.TaskFilter{NodeID: "n1"}, []string{"d", "c", "a"}},
		{store.TaskFilter{State: api.TaskQueued}, []string{"d", "c", "b"}},
		{store.TaskFilter{NodeID: "n1", State: api.TaskDispatched}, []string{"a"}},
		{store.TaskFilter{NodeID: "n3"}, []string{}},
		{store.TaskFilter{Limit: 2}, []string{"d", "c"}},
		{store.TaskFilter{CorrelationID: "corr-c"}, []string{"c"}},
		{store.TaskFilter{NodeID: "n2", CorrelationID: "corr-c"}, []string{}},
		{store.TaskFilter{Type: "diag.collect"}, []string{"b"}},
		{store.TaskFilter{Type: "diag.health_probe", State: api.TaskQueued}, []string{"d", "c"}},
	} {
		got, err := s.ListTasks(ctx, tc.f)
		must(t, err)
		diff(t, "ListTasks ids", ids(got, taskID), tc.want)
	}
	many := make([]store.Task, 0, 120)
	for i := range 120 {
		many = append(many, newTask(nth("m", i), "n4", time.Duration(i)*time.Millisecond))
	}
	enqueue(t, s, many...)
	got, err := s.ListTasks(ctx, store.TaskFilter{NodeID: "n4"})
	must(t, err)
	if len(got) != 100 {
		t.Fatalf("default limit returned %d tasks, want 100", len(got))
	}
}

func testClaimOrdering(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s,
		newTask("late", "n1", 3*time.Second),
		newTask("early", "n1", 1*time.Second),
		newTask("mid-b", "n1", 2*time.Second),
		newTask("mid-a", "n1", 2*time.Second),
		newTask("other", "n2", 0),
	)
	var got []string
	for range 4 {
		task := claim(t, s, "n1", 10*time.Second, time.Minute)
		if task.State != api.TaskDispatched || task.Attempts != 1 ||
			!task.DispatchedAt.Equal(at(10*time.Second)) || !task.LeaseExpiresAt.Equal(at(time.Minute)) {
			t.Fatalf("claimed task %+v", task)
		}
		diff(t, "stored claimed task", getTask(t, s, task.ID), task)
		got = append(got, task.ID)
	}
	diff(t, "claim order", got, []string{"early", "mid-a", "mid-b", "late"})
	if _, ok, err := s.ClaimTask(ctx, "n1", at(10*time.Second), at(time.Minute)); err != nil || ok {
		t.Fatalf("ClaimTask on empty queue = %v, %v", ok, err)
	}
	if getTask(t, s, "other").State != api.TaskQueued {
		t.Fatal("another node's task was claimed")
	}
}

func testClaimSkipsExpired(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	old := newTask("old", "n1", 0)
	old.ExpiresAt = at(time.Minute)
	enqueue(t, s, old, newTask("new", "n1", time.Second))
	// At exactly ExpiresAt the task is no longer claimable.
	if task := claim(t, s, "n1", time.Minute, 2*time.Minute); task.ID != "new" {
		t.Fatalf("claimed %s, want new", task.ID)
	}
	if _, ok, err := s.ClaimTask(ctx, "n1", at(time.Minute), at(2*time.Minute)); err != nil || ok {
		t.Fatalf("expired task claimable: %v, %v", ok, err)
	}
	if getTask(t, s, "old").State != api.TaskQueued {
		t.Fatal("expired task changed by claim")
	}
}

// testQueuedTaskNodes: each node with a claimable task once; claimed,
// expired and other nodes' finished tasks do not count, nor the tasks of a
// disabled or revoked host, which no claim hands out (the fallback would
// wake such a node's parked poll every interval for nothing).
func testQueuedTaskNodes(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	old := newTask("old", "n3", 0)
	old.ExpiresAt = at(time.Minute)
	disabled, revoked, enabled := newHost("n4"), newHost("n5"), newHost("n6")
	disabled.Enabled, revoked.Revoked = false, true
	for _, h := range []store.Host{disabled, revoked, enabled} {
		createHost(t, s, h)
	}
	enqueue(t, s, newTask("a1", "n1", 0), newTask("a2", "n1", time.Second), newTask("b1", "n2", 0), old,
		newTask("d1", "n4", 0), newTask("r1", "n5", 0), newTask("e1", "n6", 0))
	claim(t, s, "n2", 10*time.Second, time.Minute)
	got, err := s.QueuedTaskNodes(ctx, at(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	diff(t, "nodes with queued tasks", got, []string{"n1", "n6"})
}

// testClaimConcurrent: 8 claimers drain 200 tasks; each task is claimed
// exactly once.
func testClaimConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	drainOnce(t, s, 200, 8, func(int, int) ([]store.Task, error) {
		task, ok, err := s.ClaimTask(ctx, "n1", at(time.Second), at(time.Minute))
		if !ok {
			return nil, err
		}
		return []store.Task{task}, err
	})
}

// drainOnce queues n tasks of node n1 and has workers claimers call claim
// (with the worker's number and its call's) until it claims nothing; every
// task must be claimed exactly once.
func drainOnce(t *testing.T, s store.Store, n, workers int, claim func(w, i int) ([]store.Task, error)) {
	t.Helper()
	tasks := make([]store.Task, 0, n)
	for i := range n {
		tasks = append(tasks, newTask(nth("t", i), "n1", time.Duration(i)*time.Millisecond))
	}
	enqueue(t, s, tasks...)
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		wg      sync.WaitGroup
	)
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				got, err := claim(w, i)
				if err != nil {
					errs <- err
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, task := range got {
					claimed[task.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(claimed) != n {
		t.Fatalf("%d distinct tasks claimed, want %d", len(claimed), n)
	}
	for id, c := range claimed {
		if c != 1 {
			t.Errorf("task %s claimed %d times", id, c)
		}
	}
}

func testStartTask(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("t1", "n1", 0))
	claim(t, s, "n1", time.Second, time.Minute)

	_, err := s.StartTask(ctx, "n2", "t1", at(2*time.Minute))
	wantErr(t, err, store.ErrNotFound)
	_, err = s.StartTask(ctx, "n1", "nope", at(2*time.Minute))
	wantErr(t, err, store.ErrNotFound)

	got, err := s.StartTask(ctx, "n1", "t1", at(2*time.Minute))
	must(t, err)
	if got.State != api.TaskRunning || !got.LeaseExpiresAt.Equal(at(2*time.Minute)) {
		t.Fatalf("started task %+v", got)
	}
	diff(t, "stored started task", getTask(t, s, "t1"), got)
	// Running: the lease is extended, never shortened.
	got, err = s.StartTask(ctx, "n1", "t1", at(3*time.Minute))
	must(t, err)
	if got.State != api.TaskRunning || !got.LeaseExpiresAt.Equal(at(3*time.Minute)) {
		t.Fatalf("extended task %+v", got)
	}
	got, err = s.StartTask(ctx, "n1", "t1", at(time.Minute))
	must(t, err)
	if !got.LeaseExpiresAt.Equal(at(3 * time.Minute)) {
		t.Fatalf("lease shortened to %v", got.LeaseExpiresAt)
	}
	_, err = s.CompleteTask(ctx, "n1", "t1", api.TaskSucceeded, json.RawMessage(`{"status":"succeeded"}`), "h1", at(4*time.Minute), nil)
	must(t, err)
	_, err = s.StartTask(ctx, "n1", "t1", at(5*time.Minute))
	wantErr(t, err, store.ErrConflict)
}

func testCompleteTask(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("t1", "n1", 0))
	claimed := claim(t, s, "n1", time.Second, time.Minute)
	result := json.RawMessage(`{"status":"succeeded","output":{"ok":true}}`)

	_, err := s.CompleteTask(ctx, "n2", "t1", api.TaskSucceeded, result, "hash1", at(time.Minute), nil)
	wantErr(t, err, store.ErrNotFound)
	_, err = s.CompleteTask(ctx, "n1", "nope", api.TaskSucceeded, result, "hash1", at(time.Minute), nil)
	wantErr(t, err, store.ErrNotFound)

	got, err := s.CompleteTask(ctx, "n1", "t1", api.TaskSucceeded, result, "hash1", at(time.Minute), nil)
	must(t, err)
	want := claimed
	want.State, want.Result, want.ResultHash = api.TaskSucceeded, result, "hash1"
	want.FinishedAt, want.LeaseExpiresAt = at(time.Minute), time.Time{}
	diff(t, "completed task", got, want)
	diff(t, "stored completed task", getTask(t, s, "t1"), want)

	// Same result again (the agent re-posts from its spool): unchanged.
	again, err := s.CompleteTask(ctx, "n1", "t1", api.TaskSucceeded, result, "hash1", at(2*time.Minute), nil)
	must(t, err)
	diff(t, "re-posted result", again, want)
	// Another result: conflict.
	_, err = s.CompleteTask(ctx, "n1", "t1", api.TaskFailed, json.RawMessage(`{"status":"failed"}`), "hash2", at(2*time.Minute), nil)
	wantErr(t, err, store.ErrConflict)
	diff(t, "task after conflict", getTask(t, s, "t1"), want)
}

// testCompleteAfterRequeue: a result that arrives after the lease ended and
// the task went back to the queue is still accepted.
func testCompleteAfterRequeue(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("t1", "n1", 0))
	claim(t, s, "n1", time.Second, time.Minute)
	requeued, _, err := s.ReapTasks(ctx, at(2*time.Minute), nil)
	must(t, err)
	diff(t, "requeued", ids(requeued, taskID), []string{"t1"})
	got, err := s.CompleteTask(ctx, "n1", "t1", api.TaskFailed, json.RawMessage(`{"status":"failed"}`), "h", at(3*time.Minute), nil)
	must(t, err)
	if got.State != api.TaskFailed || got.Attempts != 1 {
		t.Fatalf("completed task %+v", got)
	}
	if _, ok, err := s.ClaimTask(ctx, "n1", at(4*time.Minute), at(5*time.Minute)); err != nil || ok {
		t.Fatalf("completed task claimable again: %v %v", ok, err)
	}
}

func testCompleteRejects(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	res := json.RawMessage(`{"status":"succeeded"}`)
	expiring := newTask("expired", "n1", 0)
	expiring.ExpiresAt = at(time.Minute)
	enqueue(t, s, newTask("canceled", "n1", 0), expiring, newTask("queued", "n1", time.Second))
	_, err := s.CancelTask(ctx, "canceled", at(time.Second), nil)
	must(t, err)
	_, expired, err := s.ReapTasks(ctx, at(time.Minute), nil)
	must(t, err)
	diff(t, "expired", ids(expired, taskID), []string{"expired"})

	for _, id := range []string{"canceled", "expired"} {
		_, err := s.CompleteTask(ctx, "n1", id, api.TaskSucceeded, res, "h", at(2*time.Minute), nil)
		wantErr(t, err, store.ErrConflict)
		// Even with an empty hash, which matches the stored empty hash.
		_, err = s.CompleteTask(ctx, "n1", id, api.TaskSucceeded, res, "", at(2*time.Minute), nil)
		wantErr(t, err, store.ErrConflict)
	}
	for _, st := range []api.TaskState{api.TaskQueued, api.TaskRunning, api.TaskCanceled, ""} {
		if _, err := s.CompleteTask(ctx, "n1", "queued", st, res, "h", at(2*time.Minute), nil); err == nil {
			t.Errorf("CompleteTask accepted state %q", st)
		}
	}
}

func testCancelTask(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("q", "n1", 0), newTask("d", "n1", time.Second))
	claim(t, s, "n1", time.Second, time.Minute) // q
	for _, id := range []string{"q", "d"} {
		got, err := s.CancelTask(ctx, id, at(2*time.Second), nil)
		must(t, err)
		if got.State != api.TaskCanceled || !got.FinishedAt.Equal(at(2*time.Second)) || !got.LeaseExpiresAt.IsZero() {
			t.Fatalf("canceled task %+v", got)
		}
		diff(t, "stored canceled task", getTask(t, s, id), got)
		_, err = s.CancelTask(ctx, id, at(3*time.Second), nil)
		wantErr(t, err, store.ErrConflict)
	}
	_, err := s.CancelTask(ctx, "nope", at(time.Second), nil)
	wantErr(t, err, store.ErrNotFound)
	if _, ok, err := s.ClaimTask(ctx, "n1", at(4*time.Second), at(time.Minute)); err != nil || ok {
		t.Fatalf("canceled task claimable: %v %v", ok, err)
	}
}

func testReapTasks(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	now := 10 * time.Minute
	mk := func(id, node string, created, expires time.Duration) store.Task {
		task := newTask(id, node, created)
		task.ExpiresAt = at(expires)
		return task
	}
	// Enqueue and claim in order so each claim picks the intended task.
	enqueue(t, s, mk("lease-gone", "n1", 0, time.Hour))
	claim(t, s, "n1", time.Minute, 5*time.Minute)
	enqueue(t, s, mk("running-gone", "n2", 0, time.Hour))
	claim(t, s, "n2", time.Minute, 2*time.Minute)
	_, err := s.StartTask(ctx, "n2", "running-gone", at(6*time.Minute))
	must(t, err)
	enqueue(t, s, mk("lease-ok", "n3", 0, time.Hour))
	claim(t, s, "n3", time.Minute, 20*time.Minute)
	enqueue(t, s, mk("dispatched-exp", "n4", 0, now))
	claim(t, s, "n4", time.Minute, 20*time.Minute)
	enqueue(t, s, mk("queued-exp", "n5", 0, 5*time.Minute), mk("queued-ok", "n5", time.Second, time.Hour))
	enqueue(t, s, mk("done", "n6", 0, time.Minute))
	claim(t, s, "n6", 0, time.Minute)
	_, err = s.CompleteTask(ctx, "n6", "done", api.TaskSucceeded, json.RawMessage(`{}`), "h", at(30*time.Second), nil)
	must(t, err)

	ch := subscribe(t, s)
	requeued, expired, err := s.ReapTasks(ctx, at(now), nil)
	must(t, err)
	diff(t, "requeued", ids(requeued, taskID), []string{"lease-gone", "running-gone"})
	diff(t, "expired", ids(expired, taskID), []string{"dispatched-exp", "queued-exp"})
	for _, task := range requeued {
		if task.State != api.TaskQueued || !task.LeaseExpiresAt.IsZero() || task.Attempts != 1 {
			t.Errorf("requeued task %+v", task)
		}
		diff(t, "stored requeued "+task.ID, getTask(t, s, task.ID), task)
	}
	for _, task := range expired {
		if task.State != api.TaskExpired || !task.FinishedAt.Equal(at(now)) {
			t.Errorf("expired task %+v", task)
		}
		diff(t, "stored expired "+task.ID, getTask(t, s, task.ID), task)
	}
	for id, want := range map[string]api.TaskState{"lease-ok": api.TaskDispatched, "queued-ok": api.TaskQueued, "done": api.TaskSucceeded} {
		if got := getTask(t, s, id).State; got != want {
			t.Errorf("%s: state %s, want %s", id, got, want)
		}
	}
	waitEvent(t, ch, store.Event{Kind: store.EventTask, ID: "n1"})
	waitEvent(t, ch, store.Event{Kind: store.EventTask, ID: "n2"})

	// Nothing left to reap at the same instant.
	requeued, expired, err = s.ReapTasks(ctx, at(now), nil)
	must(t, err)
	if len(requeued)+len(expired) != 0 {
		t.Fatalf("second reap: %v %v", ids(requeued, taskID), ids(expired, taskID))
	}
	// The requeued task is claimed again with a second attempt.
	again := claim(t, s, "n1", now+time.Second, now+time.Minute)
	if again.ID != "lease-gone" || again.Attempts != 2 {
		t.Fatalf("re-claimed %s attempt %d, want lease-gone attempt 2", again.ID, again.Attempts)
	}
}

func testTaskEvents(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("t1", "n1", 0), newTask("t2", "n1", 0))
	wantErr(t, s.AddTaskEvent(ctx, store.TaskEvent{TaskID: "nope", At: base, Event: json.RawMessage(`{}`)}), store.ErrNotFound)
	var want []store.TaskEvent
	for i, phase := range []string{"started", "probe", "done"} {
		ev := store.TaskEvent{TaskID: "t1", At: at(time.Duration(i) * time.Second),
			Event: json.RawMessage(`{"phase":"` + phase + `"}`)}
		must(t, s.AddTaskEvent(ctx, ev))
		ev.Seq = int64(i + 1)
		want = append(want, ev)
	}
	must(t, s.AddTaskEvent(ctx, store.TaskEvent{TaskID: "t2", Seq: 99, At: base, Event: json.RawMessage(`{}`)}))
	got, err := s.ListTaskEvents(ctx, "t1")
	must(t, err)
	diff(t, "events", got, want)
	got, err = s.ListTaskEvents(ctx, "t2")
	must(t, err)
	if len(got) != 1 || got[0].Seq != 1 {
		t.Fatalf("t2 events %+v, want one with seq 1", got)
	}
	got, err = s.ListTaskEvents(ctx, "nope")
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("unknown task has events %+v", got)
	}
}

func testTaskEventsConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("t1", "n1", 0))
	const workers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				if err := s.AddTaskEvent(ctx, store.TaskEvent{TaskID: "t1", At: base, Event: json.RawMessage(`{}`)}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := s.ListTaskEvents(ctx, "t1")
	must(t, err)
	if len(got) != workers*each {
		t.Fatalf("%d events, want %d", len(got), workers*each)
	}
	for i, e := range got {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
}
