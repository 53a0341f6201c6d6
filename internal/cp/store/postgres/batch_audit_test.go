package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// withAudit gives r an audit that records action for each task it
// claimed or applied.
func withAudit(r *taskReq, action string) *taskReq {
	r.audit = func(ts []store.Task) []store.AuditEvent {
		var es []store.AuditEvent
		for _, t := range ts {
			es = append(es, store.AuditEvent{At: time.UnixMilli(r.at), Actor: "node:" + t.NodeID, ActorTokenID: "tok", ActorRole: api.RoleAdmin,
				Action: action, Target: t.ID, Result: string(t.State), CorrelationID: "corr", Detail: "detail"})
		}
		return es
	}
	return r
}

// actionsOf is the actions of id's audit records.
func actionsOf(t *testing.T, s *Store, id string) []string {
	t.Helper()
	evs, err := s.ListAudit(context.Background(), store.AuditFilter{Target: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Action+" "+e.Result)
	}
	return out
}

// takenIDs is auditColumns whose first k calls give every record the id
// of the existing record taken, as another replica's clock might.
func takenIDs(s *Store, taken int64, k int) func([]store.AuditEvent) []any {
	calls := 0
	return func(es []store.AuditEvent) []any {
		cols := s.Store.AuditColumns(es)
		if calls++; calls <= k {
			for i := range cols[0].([]int64) {
				cols[0].([]int64)[i] = taken
			}
		}
		return cols
	}
}

// TestGroupAudited: a group's claims and results are committed with their
// audit records, in the group's transaction; a record id that is already
// taken runs the group again under new ids; when the records cannot be
// written, nothing of the group is applied and every request gets the
// error.
func TestGroupAudited(t *testing.T) {
	s, now := groupStore(t, 3, 3)
	b := &taskBatcher{pool: s.pool, auditColumns: s.Store.AuditColumns}
	many := withAudit(claimReq("n1", now), "task.claim")
	many.max = 2
	batch := []*taskReq{withAudit(claimReq("n0", now), "task.claim"), many,
		withAudit(resultReq("n2", "t2-0", "h", now), "task.result"), claimReq("nobody", now)}
	b.flush(batch)
	for i, r := range batch[:3] {
		if r.err != nil || !r.ok {
			t.Fatalf("request %d: ok=%v err=%v", i, r.ok, r.err)
		}
	}
	for id, want := range map[string]string{"t0-0": "task.claim dispatched", "t1-0": "task.claim dispatched",
		"t1-1": "task.claim dispatched", "t2-0": "task.result succeeded"} {
		if got := actionsOf(t, s, id); len(got) != 1 || got[0] != want {
			t.Errorf("%s records %v, want [%s]", id, got, want)
		}
	}
	evs, err := s.ListAudit(context.Background(), store.AuditFilter{Target: "t2-0"})
	if err != nil || len(evs) != 1 {
		t.Fatalf("t2-0's records: %v, %v", evs, err)
	}
	want := store.AuditEvent{ID: evs[0].ID, At: now, Actor: "node:n2", ActorTokenID: "tok", ActorRole: api.RoleAdmin,
		Action: "task.result", Target: "t2-0", Result: "succeeded", CorrelationID: "corr", Detail: "detail"}
	if got := evs[0]; !got.At.Equal(want.At) {
		t.Errorf("t2-0's record at %v, want %v", got.At, want.At)
	} else if got.At = want.At; got != want {
		t.Errorf("t2-0's record\n got %+v\nwant %+v", got, want)
	}
	taken := evs[0].ID

	// The first attempt's records collide: the group runs again, its
	// claims and result applied once, their records written once.
	again := &taskBatcher{pool: s.pool, auditColumns: takenIDs(s, taken, 1)}
	batch = []*taskReq{withAudit(claimReq("n0", now), "task.claim"), withAudit(resultReq("n2", "t2-1", "h", now), "task.result")}
	again.flush(batch)
	for i, r := range batch {
		if r.err != nil || !r.ok {
			t.Fatalf("request %d after a taken id: ok=%v err=%v", i, r.ok, r.err)
		}
	}
	if batch[0].task.ID != "t0-1" {
		t.Errorf("the claim run again took %s, want t0-1 (the first attempt's claim rolled back)", batch[0].task.ID)
	}
	for id, want := range map[string]string{"t0-1": "task.claim dispatched", "t2-1": "task.result succeeded"} {
		if got := actionsOf(t, s, id); len(got) != 1 || got[0] != want {
			t.Errorf("%s records %v after a taken id, want [%s]", id, got, want)
		}
	}

	// Every attempt's records are refused: nothing of the group is applied.
	failing := &taskBatcher{pool: s.pool, auditColumns: takenIDs(s, taken, maxTxAttempts)}
	batch = []*taskReq{withAudit(claimReq("n0", now), "task.claim"), withAudit(resultReq("n2", "t2-2", "h", now), "task.result")}
	failing.flush(batch)
	for i, r := range batch {
		if !errors.Is(r.err, errAuditIDTaken) || r.ok {
			t.Errorf("request %d with its records refused: ok=%v err=%v; want the error", i, r.ok, r.err)
		}
	}
	for _, id := range []string{"t0-2", "t2-2"} {
		if got := getTask(t, s, id); got.State != api.TaskQueued {
			t.Errorf("%s is %s after a group whose records failed, want queued", id, got.State)
		}
		if got := actionsOf(t, s, id); len(got) != 0 {
			t.Errorf("%s records %v, want none", id, got)
		}
	}
}
