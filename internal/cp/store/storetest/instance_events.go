package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

var instanceEventCases = []testCase{
	{"InstanceEvent/AppendList", testInstanceEventAppendList},
	{"InstanceEvent/UnknownInstance", testInstanceEventUnknown},
	{"InstanceEvent/Bounded", testInstanceEventBounded},
	{"InstanceEvent/DeletedWithInstance", testInstanceEventDeleted},
	{"InstanceEvent/ConcurrentAppends", testInstanceEventConcurrent},
	{"InstanceEvent/UpdateRecorded", testInstanceUpdateRecorded},
	{"InstanceEvent/CreateRecorded", testInstanceCreateRecorded},
}

// testInstanceCreateRecorded: CreateInstanceRecorded stores the instance
// with ev as its first event, whatever instance id ev named; a create
// that conflicts stores neither.
func testInstanceCreateRecorded(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	ev := store.InstanceEvent{InstanceID: "i-other", Seq: 7, At: base, Phase: api.InstancePending,
		DesiredState: api.DesiredRunning, Generation: 1, Actor: "operator:alice", CorrelationID: "cid-create",
		Message: "created on host h1"}
	must(t, s.CreateInstanceRecorded(ctx, newInstance("i-1", "one", "h1"), ev))
	got, err := s.ListInstanceEvents(ctx, "i-1", 0)
	must(t, err)
	want := ev
	want.InstanceID, want.Seq = "i-1", 1
	diff(t, "events of i-1", got, []store.InstanceEvent{want})

	wantErr(t, s.CreateInstanceRecorded(ctx, newInstance("i-2", "one", "h1"), ev), store.ErrConflict)
	for id, n := range map[string]int{"i-1": 1, "i-2": 0, "i-other": 0} {
		evs, err := s.ListInstanceEvents(ctx, id, 0)
		must(t, err)
		if len(evs) != n {
			t.Errorf("%s has %d events after the conflicting create, want %d", id, len(evs), n)
		}
	}
	if _, err := s.GetInstance(ctx, "i-2"); err == nil {
		t.Error("the conflicting create stored its instance")
	}
}

func seqs(evs []store.InstanceEvent) []int64 {
	out := make([]int64, 0, len(evs))
	for _, ev := range evs {
		out = append(out, ev.Seq)
	}
	return out
}

func testInstanceEventAppendList(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "one", "h1"))
	createInstance(t, s, newInstance("i-2", "two", "h1"))
	evs := []store.InstanceEvent{
		{InstanceID: "i-1", Seq: 99, At: base, Phase: api.InstancePending, DesiredState: api.DesiredRunning, Generation: 1,
			Actor: "operator:alice", CorrelationID: "cid-create", Message: "created"},
		{InstanceID: "i-1", At: at(time.Second), Phase: api.InstanceBooting, DesiredState: api.DesiredRunning, Generation: 1,
			ObservedGeneration: 1, Actor: "node:h1", CorrelationID: "cid-boot"},
		{InstanceID: "i-1", At: at(2 * time.Second), Phase: api.InstanceFailed, ReasonCode: api.ReasonHealthcheckFailed,
			Message: "3 checks failed", DesiredState: api.DesiredRunning, Generation: 1, ObservedGeneration: 1, Actor: "node:h1"},
		{InstanceID: "i-2", At: at(3 * time.Second), Phase: api.InstancePending, DesiredState: api.DesiredRunning, Generation: 1},
	}
	for _, ev := range evs {
		must(t, s.AppendInstanceEvent(ctx, ev))
	}
	got, err := s.ListInstanceEvents(ctx, "i-1", 0)
	must(t, err)
	want := []store.InstanceEvent{evs[0], evs[1], evs[2]}
	for i := range want {
		want[i].Seq = int64(i + 1)
	}
	diff(t, "events of i-1", got, want)
	// The last n, still oldest first.
	got, err = s.ListInstanceEvents(ctx, "i-1", 2)
	must(t, err)
	diff(t, "last 2 events of i-1", seqs(got), []int64{2, 3})
	got, err = s.ListInstanceEvents(ctx, "i-2", 10)
	must(t, err)
	diff(t, "events of i-2", seqs(got), []int64{1})
	// A zero At is now (UTC, whole milliseconds).
	must(t, s.AppendInstanceEvent(ctx, store.InstanceEvent{InstanceID: "i-2", Phase: api.InstanceBooting}))
	got, err = s.ListInstanceEvents(ctx, "i-2", 0)
	must(t, err)
	if last := got[len(got)-1]; last.At.IsZero() || last.At.Location() != time.UTC || last.At.Nanosecond()%int(time.Millisecond) != 0 {
		t.Fatalf("zero At stored as %v", last.At)
	}
}

func testInstanceEventUnknown(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	wantErr(t, s.AppendInstanceEvent(ctx, store.InstanceEvent{InstanceID: "i-none", Phase: api.InstancePending}), store.ErrNotFound)
	got, err := s.ListInstanceEvents(ctx, "i-none", 0)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("unknown instance has events %+v", got)
	}
}

func testInstanceEventBounded(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "one", "h1"))
	createInstance(t, s, newInstance("i-2", "two", "h1"))
	must(t, s.AppendInstanceEvent(ctx, store.InstanceEvent{InstanceID: "i-2", At: base, Phase: api.InstancePending}))
	n := store.MaxInstanceEvents + 7
	for i := 1; i <= n; i++ {
		must(t, s.AppendInstanceEvent(ctx, store.InstanceEvent{InstanceID: "i-1", At: at(time.Duration(i) * time.Millisecond),
			Phase: api.InstanceBooting, Message: fmt.Sprint(i)}))
	}
	got, err := s.ListInstanceEvents(ctx, "i-1", 0)
	must(t, err)
	if len(got) != store.MaxInstanceEvents || got[0].Seq != 8 || got[len(got)-1].Seq != int64(n) || got[0].Message != "8" {
		t.Fatalf("kept %d events, seq %d..%d, want %d events 8..%d", len(got), got[0].Seq, got[len(got)-1].Seq,
			store.MaxInstanceEvents, n)
	}
	// A limit above the bound is the bound.
	got, err = s.ListInstanceEvents(ctx, "i-1", 10*store.MaxInstanceEvents)
	must(t, err)
	if len(got) != store.MaxInstanceEvents {
		t.Fatalf("limit above the bound: %d events", len(got))
	}
	// Pruning one instance leaves the others alone.
	got, err = s.ListInstanceEvents(ctx, "i-2", 0)
	must(t, err)
	diff(t, "events of i-2", seqs(got), []int64{1})
}

func testInstanceEventDeleted(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "one", "h1"))
	for range 3 {
		must(t, s.AppendInstanceEvent(ctx, store.InstanceEvent{InstanceID: "i-1", Phase: api.InstancePending}))
	}
	must(t, s.DeleteInstance(ctx, "i-1"))
	got, err := s.ListInstanceEvents(ctx, "i-1", 0)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("events outlived their instance: %+v", got)
	}
	// A new record with the same id starts its history again.
	createInstance(t, s, newInstance("i-1", "one", "h1"))
	must(t, s.AppendInstanceEvent(ctx, store.InstanceEvent{InstanceID: "i-1", Phase: api.InstancePending}))
	got, err = s.ListInstanceEvents(ctx, "i-1", 0)
	must(t, err)
	diff(t, "events of the new i-1", seqs(got), []int64{1})
}

func testInstanceEventConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "one", "h1"))
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.AppendInstanceEvent(ctx, store.InstanceEvent{InstanceID: "i-1", Phase: api.InstanceBooting})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}
	got, err := s.ListInstanceEvents(ctx, "i-1", 0)
	must(t, err)
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i + 1)
	}
	diff(t, "seqs after concurrent appends", seqs(got), want)
}

// testInstanceUpdateRecorded: UpdateInstanceRecorded appends the event
// and the audit records record returns, from the instance as read and as
// written, in the update's transaction, the event as the updated
// instance's; none when it returns none or fn fails. DeleteInstance
// appends its audit records with the deletion.
func testInstanceUpdateRecorded(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "one", "h1"))
	record := func(before, after store.Instance) store.InstanceRecords {
		if before.Phase == after.Phase {
			return store.InstanceRecords{}
		}
		return store.InstanceRecords{Event: &store.InstanceEvent{InstanceID: after.ID, At: at(time.Second), Phase: after.Phase,
			Message: fmt.Sprintf("%s -> %s", before.Phase, after.Phase), Actor: "node:h1"},
			Audit: []store.AuditEvent{auditRecord("instance.phase", after.ID)}}
	}
	out, err := s.UpdateInstanceRecorded(ctx, "i-1", func(in *store.Instance) error { in.Phase = api.InstanceBooting; return nil }, record)
	must(t, err)
	if out.Phase != api.InstanceBooting {
		t.Fatalf("phase %s after the update", out.Phase)
	}
	got, err := s.ListInstanceEvents(ctx, "i-1", 0)
	must(t, err)
	if len(got) != 1 || got[0].Seq != 1 || got[0].Phase != api.InstanceBooting || got[0].Message != "Pending -> Booting" {
		t.Fatalf("events after a recorded transition: %+v", got)
	}
	// No transition: record returns nil, nothing appended.
	_, err = s.UpdateInstanceRecorded(ctx, "i-1", func(in *store.Instance) error { in.Message = "still booting"; return nil }, record)
	must(t, err)
	// fn fails: record is not asked.
	called := false
	_, err = s.UpdateInstanceRecorded(ctx, "i-1", func(*store.Instance) error { return store.ErrConflict },
		func(store.Instance, store.Instance) store.InstanceRecords {
			called = true
			return store.InstanceRecords{}
		})
	if err == nil || called {
		t.Fatalf("fn error: err %v, record called %v", err, called)
	}
	// The event is the updated instance's, whatever id record put in it.
	_, err = s.UpdateInstanceRecorded(ctx, "i-1", func(in *store.Instance) error { in.Phase = api.InstanceReady; return nil },
		func(_, after store.Instance) store.InstanceRecords {
			return store.InstanceRecords{Event: &store.InstanceEvent{InstanceID: "i-nope", Phase: after.Phase}}
		})
	must(t, err)
	got, err = s.ListInstanceEvents(ctx, "i-1", 0)
	must(t, err)
	if len(got) != 2 || got[1].InstanceID != "i-1" || got[1].Phase != api.InstanceReady {
		t.Fatalf("events %+v, want the second one i-1's", got)
	}
	diff(t, "i-1 records", recordsOf(t, s, "i-1"), []string{"instance.phase"})
	must(t, s.DeleteInstance(ctx, "i-1", auditRecord("instance.delete", "i-1")))
	wantErr(t, s.DeleteInstance(ctx, "i-1", auditRecord("instance.delete", "i-1")), store.ErrNotFound)
	diff(t, "i-1 records after its deletion", recordsOf(t, s, "i-1"), []string{"instance.phase", "instance.delete"})
}
