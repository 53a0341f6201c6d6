package storetest

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// The batch enqueue and typed-lease claim cases join the task cases.
func init() {
	taskCases = append(taskCases,
		testCase{"Task/InsertTasks", testInsertTasks},
		testCase{"Task/InsertTasksAllOrNothing", testInsertTasksAllOrNothing},
		testCase{"Task/ClaimLeaseByType", testClaimLeaseByType},
	)
}

// testInsertTasks: a batch is stored as single enqueues store it, and
// publishes one EventTask per node.
func testInsertTasks(t *testing.T, s store.Store) {
	ch := subscribe(t, s)
	var batch []store.Task
	for i := range 50 {
		node := "n1"
		if i%2 == 1 {
			node = "n2"
		}
		in := newTask(nth("b", i), node, time.Duration(i)*time.Millisecond)
		in.State, in.Attempts = api.TaskRunning, 3 // reset by the store
		batch = append(batch, in)
	}
	must(t, s.InsertTasks(ctxT(t), batch))
	waitEvent(t, ch, store.Event{Kind: store.EventTask, ID: "n1"})
	waitEvent(t, ch, store.Event{Kind: store.EventTask, ID: "n2"})
	for i := range 50 {
		want := batch[i]
		want.State, want.Attempts = api.TaskQueued, 0
		diff(t, "inserted task", getTask(t, s, want.ID), want)
	}
	// Claims see the batch in creation order.
	if got := claim(t, s, "n1", time.Second, time.Minute); got.ID != "b-000" {
		t.Fatalf("first claim %s, want b-000", got.ID)
	}
	must(t, s.InsertTasks(ctxT(t), nil)) // an empty batch is a no-op
}

// testInsertTasksAllOrNothing: one duplicate id fails the whole batch.
func testInsertTasksAllOrNothing(t *testing.T, s store.Store) {
	enqueue(t, s, newTask("dup", "n1", 0))
	batch := []store.Task{newTask("a", "n1", 0), newTask("dup", "n1", 0), newTask("c", "n1", 0)}
	wantErr(t, s.InsertTasks(ctxT(t), batch), store.ErrConflict)
	for _, id := range []string{"a", "c"} {
		_, err := s.GetTask(ctxT(t), id)
		wantErr(t, err, store.ErrNotFound)
	}
	bad := []store.Task{newTask("x", "n1", 0), newTask("y", "n1", 0)}
	bad[1].ExpiresAt = time.Time{}
	if err := s.InsertTasks(ctxT(t), bad); err == nil {
		t.Fatal("InsertTasks accepted a task without ExpiresAt")
	}
	_, err := s.GetTask(ctxT(t), "x")
	wantErr(t, err, store.ErrNotFound)
}

// testClaimLeaseByType: the claimed task's type picks its lease; other
// types get the default.
func testClaimLeaseByType(t *testing.T, s store.Store) {
	other := newTask("other", "n1", time.Second)
	other.Type = "diag.echo"
	enqueue(t, s, newTask("probe", "n1", 0), other)
	leases := store.ClaimLeases{Default: at(time.Hour), ByType: map[string]time.Time{
		"diag.health_probe": at(time.Minute), "vm.provision": at(2 * time.Hour)}}
	for _, want := range []struct {
		id    string
		lease time.Time
	}{{"probe", at(time.Minute)}, {"other", at(time.Hour)}} {
		got, ok, err := s.ClaimTaskLeases(ctxT(t), "n1", at(time.Second), leases)
		must(t, err)
		if !ok || got.ID != want.id || !got.LeaseExpiresAt.Equal(want.lease) || got.State != api.TaskDispatched {
			t.Fatalf("claim = %v %+v, want %s with lease %s", ok, got, want.id, want.lease)
		}
		diff(t, "stored claimed task", getTask(t, s, got.ID), got)
	}
}
