package storetest

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// A node's claim and its result are stored with their audit records in
// one transaction (ADR 0016): neither is ever stored without its record.
func init() {
	taskCases = append(taskCases,
		testCase{"Task/ClaimAudited", testTaskClaimAudited},
		testCase{"Task/CompleteAudited", testTaskCompleteAudited},
	)
}

// claimRecords is a ClaimTasks audit that records each claimed task and
// keeps what it saw.
func claimRecords(seen *[][]string) func([]store.Task) []store.AuditEvent {
	return func(ts []store.Task) []store.AuditEvent {
		var ids []string
		var es []store.AuditEvent
		for _, task := range ts {
			ids = append(ids, task.ID)
			es = append(es, auditRecord("task.claim", task.ID))
		}
		*seen = append(*seen, ids)
		return es
	}
}

func testTaskClaimAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("t1", "n1", 0), newTask("t2", "n1", time.Second), newTask("t3", "n1", 2*time.Second),
		newTask("t4", "n2", 0))
	now := at(time.Minute)
	leases := store.ClaimLeases{Default: now.Add(time.Minute)}
	var seen [][]string
	ts, err := s.ClaimTasks(ctx, "n1", now, leases, 2, claimRecords(&seen))
	must(t, err)
	if len(ts) != 2 || ts[0].ID != "t1" || ts[1].ID != "t2" {
		t.Fatalf("claimed %+v, want t1 and t2", ts)
	}
	one, err := s.ClaimTasks(ctx, "n2", now, leases, 1, claimRecords(&seen)) // the single statement's path
	must(t, err)
	if len(one) != 1 || one[0].ID != "t4" {
		t.Fatalf("claimed %+v, want t4", one)
	}
	none, err := s.ClaimTasks(ctx, "n2", now, leases, 1, claimRecords(&seen))
	must(t, err)
	if len(none) != 0 {
		t.Fatalf("claimed %+v from an empty queue", none)
	}
	diff(t, "what the audit saw, oldest first", seen, [][]string{{"t1", "t2"}, {"t4"}})
	for _, id := range []string{"t1", "t2", "t4"} {
		diff(t, id+" records", recordsOf(t, s, id), []string{"task.claim"})
	}
	diff(t, "records of a task left queued", recordsOf(t, s, "t3"), []string(nil))
}

func testTaskCompleteAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("t1", "n1", 0))
	var seen []store.Task
	record := func(task store.Task) []store.AuditEvent {
		seen = append(seen, task)
		return []store.AuditEvent{auditRecord("task.result", task.ID)}
	}
	res := []byte(`{"status":"succeeded"}`)
	got, err := s.CompleteTask(ctx, "n1", "t1", api.TaskSucceeded, res, "h1", at(time.Second), record)
	must(t, err)
	if len(seen) != 1 || seen[0].State != api.TaskSucceeded || seen[0].CorrelationID != "corr-t1" {
		t.Fatalf("audit saw %+v", seen)
	}
	diff(t, "completed task", got, seen[0])
	// A replay (same hash) changes nothing and records nothing; another
	// result, or another node's, is refused and records nothing.
	_, err = s.CompleteTask(ctx, "n1", "t1", api.TaskSucceeded, res, "h1", at(2*time.Second), record)
	must(t, err)
	_, err = s.CompleteTask(ctx, "n1", "t1", api.TaskFailed, []byte(`{"status":"failed"}`), "h2", at(2*time.Second), record)
	wantErr(t, err, store.ErrConflict)
	enqueue(t, s, newTask("t2", "n1", 0))
	_, err = s.CompleteTask(ctx, "n2", "t2", api.TaskSucceeded, res, "h3", at(2*time.Second), record)
	wantErr(t, err, store.ErrNotFound)
	if len(seen) != 1 {
		t.Errorf("audit asked %d times, want once", len(seen))
	}
	diff(t, "t1 records", recordsOf(t, s, "t1"), []string{"task.result"})
	diff(t, "t2 records", recordsOf(t, s, "t2"), []string(nil))
}
