package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
	"github.com/drover-dev/drover/internal/wire/api"
)

// withAudit gives r an audit that records action for each task it
// claimed or applied.
func withAudit(r *taskReq, action string) *taskReq {
	r.audit = func(ts []store.Task) []store.AuditEvent {
		var es []store.AuditEvent
		for _, t := range ts {
			es = append(es, store.AuditEvent{Actor: "node:" + t.NodeID, Action: action, Target: t.ID, Result: string(t.State)})
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

// TestGroupAudited: a group's claims and results are committed with their
// audit records, in the group's transaction; when the records cannot be
// written, nothing of the group is applied and every request gets the
// error.
func TestGroupAudited(t *testing.T) {
	s, now := groupStore(t, 3, 2)
	b := &taskBatcher{pool: s.pool, appendAudits: s.Store.AppendAuditsTx}
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

	down := errors.New("audit table unavailable")
	failing := &taskBatcher{pool: s.pool, appendAudits: func(context.Context, sqlstore.DB, []store.AuditEvent) error { return down }}
	batch = []*taskReq{withAudit(claimReq("n0", now), "task.claim"), withAudit(resultReq("n2", "t2-1", "h", now), "task.result")}
	failing.flush(batch)
	for i, r := range batch {
		if !errors.Is(r.err, down) || r.ok {
			t.Errorf("request %d with its records refused: ok=%v err=%v; want the error", i, r.ok, r.err)
		}
	}
	for _, id := range []string{"t0-1", "t2-1"} {
		if got := getTask(t, s, id); got.State != api.TaskQueued {
			t.Errorf("%s is %s after a group whose records failed, want queued", id, got.State)
		}
		if got := actionsOf(t, s, id); len(got) != 0 {
			t.Errorf("%s records %v, want none", id, got)
		}
	}
}
