package storetest

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// An operator's enqueue and cancel are stored with their audit records in
// one transaction (ADR 0016): a claim is never recorded before its task's
// enqueue, and a refused change leaves no record.
func init() {
	taskCases = append(taskCases,
		testCase{"Task/EnqueueAudited", testTaskEnqueueAudited},
		testCase{"Task/CancelAudited", testTaskCancelAudited},
	)
}

// auditRecord is the record the tests ask the store to write for id.
func auditRecord(action, id string) store.AuditEvent {
	return store.AuditEvent{At: at(time.Minute), Actor: "operator:test", Action: action, Target: id,
		Result: "ok", CorrelationID: "corr-" + id}
}

// recordsOf returns the actions of id's records, oldest first.
func recordsOf(t *testing.T, s store.Store, id string) []string {
	t.Helper()
	evs, err := s.ListAudit(ctxT(t), store.AuditFilter{Target: id})
	must(t, err)
	var out []string
	for i := len(evs) - 1; i >= 0; i-- {
		out = append(out, evs[i].Action)
	}
	return out
}

func testTaskEnqueueAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	must(t, s.EnqueueTask(ctx, newTask("t1", "n1", 0), auditRecord("task.enqueue", "t1")))
	must(t, s.InsertTasks(ctx, []store.Task{newTask("t2", "n1", 0), newTask("t3", "n2", 0)},
		auditRecord("task.enqueue_batch", "t2")))
	diff(t, "t1 records", recordsOf(t, s, "t1"), []string{"task.enqueue"})
	diff(t, "t2 records", recordsOf(t, s, "t2"), []string{"task.enqueue_batch"})

	// A batch refused for a duplicate id stores neither its tasks nor its
	// record.
	err := s.InsertTasks(ctx, []store.Task{newTask("t4", "n1", 0), newTask("t1", "n1", 0)},
		auditRecord("task.enqueue_batch", "t4"))
	wantErr(t, err, store.ErrConflict)
	if _, err := s.GetTask(ctx, "t4"); err == nil {
		t.Error("t4 stored by a refused batch")
	}
	diff(t, "records of a refused batch", recordsOf(t, s, "t4"), []string(nil))
	// Without records, nothing is audited.
	enqueue(t, s, newTask("t5", "n1", 0))
	diff(t, "t5 records", recordsOf(t, s, "t5"), []string(nil))
}

func testTaskCancelAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	enqueue(t, s, newTask("t1", "n1", 0))
	var seen []store.Task
	record := func(task store.Task) []store.AuditEvent {
		seen = append(seen, task)
		return []store.AuditEvent{auditRecord("task.cancel", task.ID)}
	}
	got, err := s.CancelTask(ctx, "t1", at(time.Second), record)
	must(t, err)
	if len(seen) != 1 || seen[0].State != api.TaskCanceled || seen[0].CorrelationID != "corr-t1" {
		t.Fatalf("audit saw %+v", seen)
	}
	diff(t, "canceled task", got, seen[0])
	diff(t, "t1 records", recordsOf(t, s, "t1"), []string{"task.cancel"})
	// A refused cancel (already terminal, or no such task) asks for no
	// record and stores none.
	seen = nil
	_, err = s.CancelTask(ctx, "t1", at(2*time.Second), record)
	wantErr(t, err, store.ErrConflict)
	_, err = s.CancelTask(ctx, "nope", at(2*time.Second), record)
	wantErr(t, err, store.ErrNotFound)
	if len(seen) != 0 {
		t.Errorf("audit asked for refused cancels: %+v", seen)
	}
	diff(t, "t1 records after a refused cancel", recordsOf(t, s, "t1"), []string{"task.cancel"})
}
