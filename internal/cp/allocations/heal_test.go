package allocations

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// storeTasks queues tasks in the store as the tasks room would.
type storeTasks struct {
	st  store.Store
	now func() time.Time
	mu  sync.Mutex
	n   int
}

func (f *storeTasks) NewTask(_ context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task {
	f.mu.Lock()
	f.n++
	id := fmt.Sprintf("tsk_new%d", f.n)
	f.mu.Unlock()
	now := f.now()
	return store.Task{ID: id, NodeID: nodeID, Type: typ, Params: params, State: api.TaskQueued, CreatedBy: "test",
		CreatedAt: now, ExpiresAt: now.Add(ttl)}
}

func (f *storeTasks) Enqueue(ctx context.Context, t store.Task) error {
	return f.st.EnqueueTask(ctx, t)
}

type noTerminals struct{}

func (noTerminals) CloseAllocation(string) {}

// healRig is the allocations room on a SQLite store, at a clock the test
// moves.
type healRig struct {
	t    *testing.T
	st   store.Store
	room *Room
	mu   sync.Mutex
	at   time.Time
}

func newHealRig(t *testing.T) *healRig {
	st, err := sqlite.Open(t.Context(), sqlite.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := &healRig{t: t, st: st, at: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	log := slog.New(slog.DiscardHandler)
	if err := st.CreateHost(t.Context(), store.Host{ID: "h1", Enabled: true, CreatedAt: r.now(), UpdatedAt: r.now()}); err != nil {
		t.Fatal(err)
	}
	r.room = New(st, nil, &storeTasks{st: st, now: r.now}, noTerminals{}, audit.New(st, r.now, log), nil, log, r.now)
	return r
}

func (r *healRig) now() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at
}

func (r *healRig) advance(d time.Duration) {
	r.mu.Lock()
	r.at = r.at.Add(d)
	r.mu.Unlock()
}

// task queues a user task of h1 for allocation id, and finishes it as
// state when that is a final state.
func (r *healRig) task(id, typ, allocation string, state api.TaskState) {
	r.t.Helper()
	ctx := r.t.Context()
	params, _ := json.Marshal(map[string]string{"allocation_id": allocation, "username": "alice"})
	if err := r.st.EnqueueTask(ctx, store.Task{ID: id, NodeID: "h1", Type: typ, Params: params, CreatedAt: r.now(),
		ExpiresAt: r.now().Add(time.Hour)}); err != nil {
		r.t.Fatal(err)
	}
	if state == api.TaskQueued {
		return
	}
	res := api.TaskResult{Status: api.ResultSucceeded}
	if state == api.TaskFailed {
		res = api.TaskResult{Status: api.ResultFailed, Error: &api.ResultError{Code: "userdel_failed", Message: "busy"}}
	}
	b, _ := json.Marshal(res)
	if _, err := r.st.CompleteTask(ctx, "h1", id, state, b, "hash-"+id, r.now(), nil); err != nil {
		r.t.Fatal(err)
	}
}

// allocation stores a host allocation of h1 in state with its tasks' ids.
func (r *healRig) allocation(id string, state api.AllocationState, provision, release string) {
	r.t.Helper()
	a := store.Allocation{ID: id, Username: "alice", HostID: "h1", State: state, ProvisionTaskID: provision,
		ReleaseTaskID: release, Spec: json.RawMessage(`{"username":"alice","host_id":"h1"}`), CreatedBy: "operator:test",
		CreatedAt: r.now(), UpdatedAt: r.now()}
	if err := r.st.CreateAllocation(r.t.Context(), a); err != nil {
		r.t.Fatal(err)
	}
}

func (r *healRig) get(id string) store.Allocation {
	r.t.Helper()
	a, err := r.st.GetAllocation(r.t.Context(), id)
	if err != nil {
		r.t.Fatal(err)
	}
	return a
}

// release is DELETE /api/v1/allocations/{id}.
func (r *healRig) release(id string) {
	r.t.Helper()
	req := httptest.NewRequest(http.MethodDelete, "/api/v1/allocations/"+id, nil)
	req.SetPathValue("id", id)
	w := httptest.NewRecorder()
	if err := r.room.Release(w, req); err != nil || w.Code != http.StatusAccepted {
		r.t.Fatalf("release %s: %d %v", id, w.Code, err)
	}
}

// queued says whether task id is in the store, queued, for allocation a.
func (r *healRig) queued(id, typ, allocation string) bool {
	t, err := r.st.GetTask(r.t.Context(), id)
	var p struct {
		AllocationID string `json:"allocation_id"`
	}
	return err == nil && t.State == api.TaskQueued && t.Type == typ && json.Unmarshal(t.Params, &p) == nil && p.AllocationID == allocation
}

// TestReleaseRetriesDeprovision: releasing again an allocation whose
// deprovision failed, or whose deprovision task never reached the store,
// queues the deprovision again (the user must go); one whose deprovision
// is still queued is left to it.
func TestReleaseRetriesDeprovision(t *testing.T) {
	r := newHealRig(t)
	r.allocation("failed", api.AllocationReleasing, "", "tsk_f")
	r.task("tsk_f", task.TypeAllocDeprovisionUser, "failed", api.TaskFailed)
	r.room.settle(t.Context(), "failed", mustTask(t, r.st, "tsk_f"), &api.TaskResult{Error: &api.ResultError{Code: "userdel_failed", Message: "busy"}})
	if a := r.get("failed"); a.State != api.AllocationReleasing || a.StateReason != "userdel_failed: busy" {
		t.Fatalf("after the failed deprovision: %s %q, want releasing with the reason", a.State, a.StateReason)
	}
	r.allocation("lost", api.AllocationReleasing, "", "tsk_lost") // never queued
	r.allocation("busy", api.AllocationReleasing, "", "tsk_q")
	r.task("tsk_q", task.TypeAllocDeprovisionUser, "busy", api.TaskQueued)

	for _, id := range []string{"failed", "lost", "busy"} {
		r.release(id)
	}
	for _, c := range []struct{ id, old string }{{"failed", "tsk_f"}, {"lost", "tsk_lost"}} {
		a := r.get(c.id)
		if a.State != api.AllocationReleasing || a.StateReason != "" || a.ReleaseTaskID == c.old ||
			!r.queued(a.ReleaseTaskID, task.TypeAllocDeprovisionUser, c.id) {
			t.Errorf("%s after a second release: %s %q task %s, want releasing with a new queued deprovision", c.id, a.State,
				a.StateReason, a.ReleaseTaskID)
		}
	}
	if a := r.get("busy"); a.ReleaseTaskID != "tsk_q" {
		t.Errorf("busy: release task %s, want tsk_q still", a.ReleaseTaskID)
	}
	evs, err := r.st.ListAudit(t.Context(), store.AuditFilter{Action: "allocation.release", Target: "failed"})
	if err != nil || len(evs) != 1 || evs[0].Detail != "retry: task tsk_f failed" {
		t.Errorf("audit of the retry: %+v, %v", evs, err)
	}
}

// TestSweepHealsAllocations: the sweep settles an allocation whose task
// finished without its event, fails a provisioning one whose task never
// reached the store, queues again the deprovision of a releasing one
// whose task never did, and leaves alone the young ones (their task may
// be on its way), the ones still waiting, a failed deprovision (the
// operator releases again) and instance allocations.
func TestSweepHealsAllocations(t *testing.T) {
	r := newHealRig(t)
	r.allocation("done", api.AllocationProvisioning, "tsk_done", "")
	r.task("tsk_done", task.TypeAllocProvisionUser, "done", api.TaskSucceeded)
	r.allocation("released", api.AllocationReleasing, "", "tsk_rel")
	r.task("tsk_rel", task.TypeAllocDeprovisionUser, "released", api.TaskSucceeded)
	r.allocation("lost-provision", api.AllocationProvisioning, "tsk_lp", "")
	r.allocation("lost-release", api.AllocationReleasing, "", "tsk_lr")
	r.allocation("waiting", api.AllocationProvisioning, "tsk_w", "")
	r.task("tsk_w", task.TypeAllocProvisionUser, "waiting", api.TaskQueued)
	r.allocation("deprovision-failed", api.AllocationReleasing, "", "tsk_df")
	r.task("tsk_df", task.TypeAllocDeprovisionUser, "deprovision-failed", api.TaskFailed)
	if err := r.st.CreateAllocation(t.Context(), store.Allocation{ID: "console", Username: "alice", HostID: "h1", InstanceID: "i1",
		State: api.AllocationProvisioning, CreatedAt: r.now(), UpdatedAt: r.now()}); err != nil {
		t.Fatal(err)
	}
	r.advance(sweepGrace + time.Second)
	r.allocation("young", api.AllocationProvisioning, "tsk_young", "") // its task may still be on its way

	if err := r.room.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		state  api.AllocationState
		reason string
	}{
		"done":               {api.AllocationActive, ""},
		"released":           {api.AllocationReleased, ""},
		"lost-provision":     {api.AllocationFailed, "allocation.provision_user task tsk_lp is not in the store: it was never queued"},
		"lost-release":       {api.AllocationReleasing, ""},
		"waiting":            {api.AllocationProvisioning, ""},
		"deprovision-failed": {api.AllocationReleasing, "userdel_failed: busy"},
		"console":            {api.AllocationProvisioning, ""},
		"young":              {api.AllocationProvisioning, ""},
	}
	for id, w := range want {
		if a := r.get(id); a.State != w.state || a.StateReason != w.reason {
			t.Errorf("%s: %s %q, want %s %q", id, a.State, a.StateReason, w.state, w.reason)
		}
	}
	if a := r.get("lost-release"); a.ReleaseTaskID == "tsk_lr" || !r.queued(a.ReleaseTaskID, task.TypeAllocDeprovisionUser, "lost-release") {
		t.Errorf("lost-release: release task %s, want a new queued deprovision", a.ReleaseTaskID)
	}
	if a := r.get("deprovision-failed"); a.ReleaseTaskID != "tsk_df" {
		t.Errorf("deprovision-failed: release task %s, want tsk_df (not retried by the sweep)", a.ReleaseTaskID)
	}
	// A second sweep changes nothing more.
	before, _ := r.st.ListAudit(t.Context(), store.AuditFilter{})
	if err := r.room.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if after, _ := r.st.ListAudit(t.Context(), store.AuditFilter{}); len(after) != len(before) {
		t.Errorf("a second sweep wrote %d audit records, want none", len(after)-len(before))
	}
}

// TestTaskEventSettles: the task bus's finished event moves the
// allocation on as before (the sweep shares settle).
func TestTaskEventSettles(t *testing.T) {
	r := newHealRig(t)
	r.allocation("a", api.AllocationProvisioning, "tsk_a", "")
	r.task("tsk_a", task.TypeAllocProvisionUser, "a", api.TaskFailed)
	r.room.taskDone(t.Context(), taskbus.Finished{Task: mustTask(t, r.st, "tsk_a"),
		Result: &api.TaskResult{Status: api.ResultFailed, Error: &api.ResultError{Code: "useradd_failed", Message: "exists"}}})
	if a := r.get("a"); a.State != api.AllocationFailed || a.StateReason != "useradd_failed: exists" {
		t.Fatalf("after the failed provision: %s %q", a.State, a.StateReason)
	}
}

func mustTask(t *testing.T, st store.Store, id string) store.Task {
	t.Helper()
	tk, err := st.GetTask(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}
