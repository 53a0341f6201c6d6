package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// hostStatusCases: a host status transition (or health change) is stored
// with its failure and its audit record in one transaction, by each of the
// writes that change one.
var hostStatusCases = []testCase{
	{"HostStatus/MarkStaleWritesMark", testMarkStaleWritesMark},
	{"HostStatus/TouchHostsAuditsRevived", testTouchHostsAuditsRevived},
	{"HostStatus/UpdateHostAudited", testUpdateHostAudited},
	{"HostStatus/UpdateHostHealth", testUpdateHostHealth},
	{"HostStatus/ReapTasksAudited", testReapTasksAudited},
	{"HostStatus/MarkStaleMany", testMarkStaleMany},
}

// statusAudit is the record the tests ask the store to write for id.
func statusAudit(id, result string) store.AuditEvent {
	return store.AuditEvent{At: at(time.Hour), Actor: "system", Action: "host.status", Target: id,
		Result: result, CorrelationID: "cid_" + id}
}

// auditsOf returns the results of id's host.status records, oldest first.
func auditsOf(t *testing.T, s store.Store, id string) []string {
	t.Helper()
	evs, err := s.ListAudit(ctxT(t), store.AuditFilter{Target: id, Action: "host.status"})
	must(t, err)
	var out []string
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].CorrelationID != "cid_"+id {
			t.Errorf("%s: record %+v", id, evs[i])
		}
		out = append(out, evs[i].Result)
	}
	return out
}

// testMarkStaleWritesMark: each host about to turn stale gets what mark
// says, with the stale status: its failure, its audit record, or (heard
// from after all) its newer last-seen time and its old status. Each host
// marked publishes EventHost.
func testMarkStaleWritesMark(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	cutoff := at(10 * time.Minute)
	for _, id := range []string{"failed", "plain", "heard"} {
		createHost(t, s, hostWith(id, api.HostHealthy, at(time.Minute)))
	}
	createHost(t, s, hostWith("fresh", api.HostHealthy, at(11*time.Minute)))
	ch := subscribe(t, s)
	fail := store.Failure{Signal: "heartbeat_stale", Detail: "no heartbeat", CorrelationID: "cid_failed", At: at(20 * time.Minute)}
	var asked []string
	got, err := s.MarkStale(ctx, cutoff, func(id string, lastSeen time.Time) store.StaleMark {
		asked = append(asked, id)
		if !lastSeen.Equal(at(time.Minute)) {
			t.Errorf("%s: lastSeen %v, want %v", id, lastSeen, at(time.Minute))
		}
		switch id {
		case "failed":
			return store.StaleMark{Failure: fail, Audit: statusAudit(id, "stale")}
		case "heard":
			return store.StaleMark{HeardAt: at(12 * time.Minute), Audit: statusAudit(id, "stale")}
		}
		return store.StaleMark{}
	})
	must(t, err)
	diff(t, "asked", asked, []string{"failed", "heard", "plain"})
	diff(t, "marked", got, []string{"failed", "plain"})
	waitEvent(t, ch, store.Event{Kind: store.EventHost, ID: "failed"})
	waitEvent(t, ch, store.Event{Kind: store.EventHost, ID: "plain"})

	h, err := s.GetHost(ctx, "failed")
	must(t, err)
	if h.Status != api.HostStale || h.LastFailure != fail {
		t.Errorf("failed: %s %+v, want stale with %+v", h.Status, h.LastFailure, fail)
	}
	diff(t, "failed's records", auditsOf(t, s, "failed"), []string{"stale"})
	h, err = s.GetHost(ctx, "plain")
	must(t, err)
	if h.Status != api.HostStale || h.LastFailure != (store.Failure{}) {
		t.Errorf("plain: %s %+v, want stale with no failure", h.Status, h.LastFailure)
	}
	diff(t, "plain's records", auditsOf(t, s, "plain"), []string(nil))
	h, err = s.GetHost(ctx, "heard")
	must(t, err)
	if h.Status != api.HostHealthy || !h.LastSeenAt.Equal(at(12*time.Minute)) {
		t.Errorf("heard: %s last seen %v, want healthy %v", h.Status, h.LastSeenAt, at(12*time.Minute))
	}
	diff(t, "heard's records", auditsOf(t, s, "heard"), []string(nil))
}

// testTouchHostsAuditsRevived: a revived host's record is written with
// its revival, a host that was already healthy gets none.
func testTouchHostsAuditsRevived(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, hostWith("stale", api.HostStale, at(time.Minute)))
	createHost(t, s, hostWith("unknown", api.HostUnknown, time.Time{}))
	createHost(t, s, hostWith("healthy", api.HostHealthy, at(time.Minute)))
	var asked []string
	revived, err := s.TouchHosts(ctx, []store.Seen{
		{HostID: "unknown", At: at(5 * time.Minute)}, {HostID: "stale", At: at(5 * time.Minute)},
		{HostID: "healthy", At: at(5 * time.Minute)},
	}, func(id string) store.AuditEvent {
		asked = append(asked, id)
		if id == "unknown" {
			return store.AuditEvent{} // none
		}
		return statusAudit(id, "healthy")
	})
	must(t, err)
	diff(t, "revived", revived, []string{"stale", "unknown"})
	diff(t, "asked", asked, []string{"stale", "unknown"})
	diff(t, "stale's records", auditsOf(t, s, "stale"), []string{"healthy"})
	diff(t, "unknown's records", auditsOf(t, s, "unknown"), []string(nil))
	diff(t, "healthy's records", auditsOf(t, s, "healthy"), []string(nil))
}

// testUpdateHostAudited: audit sees the host as read and as fn left it,
// and its records are written with the change; an fn error writes
// neither.
func testUpdateHostAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, hostWith("h1", api.HostStale, at(time.Minute)))
	toHealthy := func(h *store.Host) error { h.Status = api.HostHealthy; return nil }
	audit := func(before, after store.Host) []store.AuditEvent {
		if before.Status == after.Status {
			return nil
		}
		return []store.AuditEvent{statusAudit("h1", string(before.Status)+">"+string(after.Status))}
	}
	h, err := s.UpdateHostAudited(ctx, "h1", toHealthy, audit)
	must(t, err)
	if h.Status != api.HostHealthy {
		t.Fatalf("status %s", h.Status)
	}
	if _, err := s.UpdateHostAudited(ctx, "h1", toHealthy, audit); err != nil { // no transition, no record
		t.Fatal(err)
	}
	boom := errors.New("boom")
	_, err = s.UpdateHostAudited(ctx, "h1", func(h *store.Host) error { h.Status = api.HostStale; return boom }, audit)
	if !errors.Is(err, boom) {
		t.Fatalf("fn error: %v", err)
	}
	diff(t, "records", auditsOf(t, s, "h1"), []string{"stale>healthy"})
	if _, err := s.UpdateHostAudited(ctx, "missing", toHealthy, audit); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing host: %v, want ErrNotFound", err)
	}
}

// testUpdateHostHealth: fn sees the stored health and failure, and what it
// leaves is written with its audit records and an EventHost, the rest of
// the row untouched; an fn error writes nothing.
func testUpdateHostHealth(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	full := fullHost("h1")
	createHost(t, s, full)
	before, err := s.GetHost(ctx, "h1")
	must(t, err)
	ch := subscribe(t, s)
	want := store.HealthState{
		Health:      store.Health{State: api.HealthUnhealthy, Summary: "disk full", CheckedAt: at(30 * time.Minute), TaskID: "t_2"},
		LastFailure: store.Failure{Signal: "node_health_probe_unhealthy", Detail: "disk full", CorrelationID: "cid_h1", At: at(30 * time.Minute)},
	}
	err = s.UpdateHostHealth(ctx, "h1", func(h *store.HealthState) ([]store.AuditEvent, error) {
		if h.Health != before.Health || h.LastFailure != before.LastFailure {
			t.Errorf("fn saw %+v, want %+v and %+v", *h, before.Health, before.LastFailure)
		}
		*h = want
		return []store.AuditEvent{statusAudit("h1", "unhealthy")}, nil
	})
	must(t, err)
	waitEvent(t, ch, store.Event{Kind: store.EventHost, ID: "h1"})
	after, err := s.GetHost(ctx, "h1")
	must(t, err)
	if after.Health != want.Health || after.LastFailure != want.LastFailure {
		t.Errorf("stored %+v %+v, want %+v", after.Health, after.LastFailure, want)
	}
	after.Health, after.LastFailure, after.UpdatedAt = before.Health, before.LastFailure, before.UpdatedAt
	diff(t, "the rest of the row", after, before)
	diff(t, "records", auditsOf(t, s, "h1"), []string{"unhealthy"})

	boom := errors.New("boom")
	err = s.UpdateHostHealth(ctx, "h1", func(h *store.HealthState) ([]store.AuditEvent, error) {
		h.Health.State = api.HealthHealthy
		return []store.AuditEvent{statusAudit("h1", "healthy")}, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("fn error: %v", err)
	}
	if h, _ := s.GetHost(ctx, "h1"); h.Health != want.Health {
		t.Errorf("after an fn error: %+v", h.Health)
	}
	diff(t, "records after an fn error", auditsOf(t, s, "h1"), []string{"unhealthy"})
	err = s.UpdateHostHealth(ctx, "missing", func(*store.HealthState) ([]store.AuditEvent, error) { return nil, nil })
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing host: %v, want ErrNotFound", err)
	}
}

// testReapTasksAudited: the records audit returns for the tasks a reap
// requeued and expired are written with the reap, so a requeued task
// claimed again already has its record; a reap of nothing asks for none.
func testReapTasksAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	expiring := newTask("t-exp", "n1", time.Second)
	expiring.ExpiresAt = at(time.Minute)
	enqueue(t, s, newTask("t-lease", "n1", 0), expiring)
	claim(t, s, "n1", time.Second, 30*time.Second) // the older: t-lease
	record := func(ts []store.Task, result string) []store.AuditEvent {
		var out []store.AuditEvent
		for _, task := range ts {
			out = append(out, store.AuditEvent{Actor: "system", Action: "task.reap", Target: task.ID, Result: result})
		}
		return out
	}
	var calls int
	requeued, expired, err := s.ReapTasks(ctx, at(time.Minute), func(requeued, expired []store.Task) []store.AuditEvent {
		calls++
		return append(record(requeued, "requeued"), record(expired, "expired")...)
	})
	must(t, err)
	diff(t, "requeued", ids(requeued, taskID), []string{"t-lease"})
	diff(t, "expired", ids(expired, taskID), []string{"t-exp"})
	if _, ok, err := s.ClaimTask(ctx, "n1", at(2*time.Minute), at(3*time.Minute)); err != nil || !ok {
		t.Fatalf("requeued task not claimable: %v %v", ok, err)
	}
	for id, want := range map[string]string{"t-lease": "requeued", "t-exp": "expired"} {
		evs, err := s.ListAudit(ctx, store.AuditFilter{Action: "task.reap", Target: id})
		must(t, err)
		if len(evs) != 1 || evs[0].Result != want {
			t.Errorf("%s: records %+v, want one %s", id, evs, want)
		}
	}
	if _, _, err := s.ReapTasks(ctx, at(2*time.Minute), func(requeued, expired []store.Task) []store.AuditEvent {
		calls++
		return append(record(requeued, "requeued"), record(expired, "expired")...)
	}); err != nil {
		t.Fatal(err)
	}
	if evs, _ := s.ListAudit(ctx, store.AuditFilter{Action: "task.reap"}); len(evs) != 2 || calls != 2 {
		t.Errorf("after a reap of nothing: %d records, %d calls", len(evs), calls)
	}
}

// testMarkStaleMany: a sweep that finds more hosts than one transaction
// takes asks mark once for each host, marks every one it does not hear
// from, and writes each one's record.
func testMarkStaleMany(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	const n = 1100
	for i := range n {
		createHost(t, s, hostWith(nth("many", i), api.HostHealthy, at(time.Minute)))
	}
	asked := make(map[string]int)
	got, err := s.MarkStale(ctx, at(10*time.Minute), func(id string, _ time.Time) store.StaleMark {
		asked[id]++
		if id[len(id)-2:] == "00" { // every hundredth heard from meanwhile
			return store.StaleMark{HeardAt: at(11 * time.Minute)}
		}
		return store.StaleMark{Audit: statusAudit(id, "stale")}
	})
	must(t, err)
	if len(asked) != n {
		t.Fatalf("mark asked for %d hosts, want %d", len(asked), n)
	}
	for id, k := range asked {
		if k != 1 {
			t.Fatalf("mark asked %d times for %s", k, id)
		}
	}
	if len(got) != n-11 {
		t.Fatalf("marked %d hosts, want %d", len(got), n-11)
	}
	evs, err := s.ListAudit(ctx, store.AuditFilter{Action: "host.status", Limit: 2 * n})
	must(t, err)
	if len(evs) != n-11 {
		t.Fatalf("%d records, want %d", len(evs), n-11)
	}
	for _, id := range []string{nth("many", 0), nth("many", 1), nth("many", 1099)} {
		h, err := s.GetHost(ctx, id)
		must(t, err)
		want := api.HostStale
		if id == nth("many", 0) {
			want = api.HostHealthy
		}
		if h.Status != want {
			t.Errorf("%s: %s, want %s", id, h.Status, want)
		}
	}
}
