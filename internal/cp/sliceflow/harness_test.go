package sliceflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
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

// clock is a fake clock: each reading is one second after the last.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

// fakeTasks is the task queue: tasks go to the store as the tasks room
// would put them; failEnqueue makes Enqueue fail (the store down).
type fakeTasks struct {
	st          store.Store
	clk         *clock
	mu          sync.Mutex
	n           int
	failEnqueue bool
}

func (f *fakeTasks) NewTask(_ context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task {
	f.mu.Lock()
	f.n++
	id := fmt.Sprintf("tsk_%04d", f.n)
	f.mu.Unlock()
	now := f.clk.now()
	return store.Task{ID: id, NodeID: nodeID, Type: typ, Params: params, State: api.TaskQueued, CreatedBy: "test",
		CreatedAt: now, ExpiresAt: now.Add(ttl)}
}

func (f *fakeTasks) Enqueue(ctx context.Context, t store.Task) error {
	f.mu.Lock()
	fail := f.failEnqueue
	f.mu.Unlock()
	if fail {
		return errors.New("enqueue: store down")
	}
	return f.st.EnqueueTask(ctx, t)
}

type harness struct {
	t     *testing.T
	ctx   context.Context
	st    store.Store
	clk   *clock
	tasks *fakeTasks
	bus   *taskbus.Bus
	room  *Room
}

func intp(i int) *int       { return &i }
func strp(s string) *string { return &s }

// newHarness is a store with host h1 and its approved slots (NUMA nodes
// as given, one slot each), and a room subscribed to a bus.
func newHarness(t *testing.T, numa ...int) *harness {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := &clock{t: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
	h := &harness{t: t, ctx: ctx, st: st, clk: clk, tasks: &fakeTasks{st: st, clk: clk}}
	if err := st.CreateHost(ctx, store.Host{ID: "h1", Enabled: true}); err != nil {
		t.Fatal(err)
	}
	var slots []store.Slot
	for i, n := range numa {
		spec, _ := json.Marshal(slotSpec{PCIAddress: fmt.Sprintf("0000:%02x:00.0", 0x10+i), NUMANode: intp(n),
			NVMeDevice: strp(fmt.Sprintf("/dev/disk/by-id/nvme-%d", i)), MACAddress: fmt.Sprintf("52:54:00:00:00:%02x", i),
			PrivateIP: strp(fmt.Sprintf("10.77.0.%d", 10+i))})
		slots = append(slots, store.Slot{HostID: "h1", SlotID: fmt.Sprintf("slot-%d", i), Index: i, Spec: spec, ApprovedAt: clk.now()})
	}
	if len(slots) > 0 {
		if err := st.ApproveSlots(ctx, slots); err != nil {
			t.Fatal(err)
		}
	}
	h.restart()
	return h
}

// restart is a new control plane over the same store: a new room on a
// new bus (the old one's subscriptions are gone with it).
func (h *harness) restart() {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h.bus = taskbus.New()
	h.room = New(h.st, h.tasks, audit.New(h.st, h.clk.now, log), log, h.clk.now)
	h.room.Subscribe(h.bus)
}

// create stores a slice allocation asking for n slots on h1 and starts
// its workflow; the start's error is returned.
func (h *harness) create(id string, n int) error {
	h.t.Helper()
	req := api.CreateAllocationRequest{Username: "alice", HostID: "h1", SliceRequest: api.SliceRequest{Slots: n,
		Image: "https://images.example/jammy.qcow2", ImageSHA256: "ab" + fmt.Sprintf("%062d", 0), VCPUs: 2, MemoryMiB: 1024}}
	spec, _ := json.Marshal(req)
	a := store.Allocation{ID: id, Username: "alice", HostID: "h1", State: api.AllocationProvisioning, Spec: spec,
		CreatedAt: h.clk.now()}
	if err := h.st.CreateAllocation(h.ctx, a); err != nil {
		h.t.Fatal(err)
	}
	return h.room.Start(h.ctx, a)
}

// queued returns the queued tasks of type typ.
func (h *harness) queued(typ string) []store.Task {
	h.t.Helper()
	ts, err := h.st.ListTasks(h.ctx, store.TaskFilter{Type: typ, State: api.TaskQueued})
	if err != nil {
		h.t.Fatal(err)
	}
	return ts
}

func (h *harness) all(typ string) []store.Task {
	h.t.Helper()
	ts, err := h.st.ListTasks(h.ctx, store.TaskFilter{Type: typ})
	if err != nil {
		h.t.Fatal(err)
	}
	return ts
}

// answer claims task id as node h1 and posts a result; publish delivers
// the task event (false: the control plane was down when it came).
func (h *harness) answer(id string, ok bool, output any, publish bool) {
	h.t.Helper()
	now := h.clk.now()
	for {
		t, got, err := h.st.ClaimTask(h.ctx, "h1", now, now.Add(time.Hour))
		if err != nil {
			h.t.Fatal(err)
		}
		if !got || t.ID == id {
			break
		}
	}
	out, _ := json.Marshal(output)
	res := api.TaskResult{Status: api.ResultSucceeded, Output: out, FinishedAt: now}
	state := api.TaskSucceeded
	if !ok {
		res.Status, state = api.ResultFailed, api.TaskFailed
		res.Error = &api.ResultError{Code: "phase_failed", Message: "vfio_bind_check: device busy"}
	}
	raw, _ := json.Marshal(res)
	t, err := h.st.CompleteTask(h.ctx, "h1", id, state, raw, "", now, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if publish {
		h.bus.PublishFinished(h.ctx, taskbus.Finished{Task: t, Result: &res})
	}
}

func readyOutput() map[string]any {
	return map[string]any{"default_user": "alice", "private_ip": "10.77.0.10", "ssh_host": "10.77.0.10", "ssh_port": 22,
		"readiness": map[string]any{"ready": true}, "performance": map[string]any{"accel": "kvm"},
		"timings": map[string]int64{"virt_install_ms": 12}, "raw_vnc": false, "console_model": "gateway_required",
		"phases": []map[string]any{{"phase": "lease_acquire", "status": "ok"}, {"phase": "readiness", "status": "ok"}}}
}

func (h *harness) workflow(id string) store.SliceWorkflow {
	h.t.Helper()
	w, err := h.st.GetSliceWorkflow(h.ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	return w
}

func (h *harness) alloc(id string) store.Allocation {
	h.t.Helper()
	a, err := h.st.GetAllocation(h.ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

func (h *harness) leases() []store.SlotLease {
	h.t.Helper()
	ls, err := h.st.ListSlotLeases(h.ctx, "")
	if err != nil {
		h.t.Fatal(err)
	}
	return ls
}

// stepStates is step → state of a workflow's records.
func (h *harness) stepStates(id string) map[string]string {
	h.t.Helper()
	steps, err := h.st.ListSliceSteps(h.ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	m := map[string]string{}
	for _, s := range steps {
		m[s.Step] = s.State
	}
	return m
}

func (h *harness) wantStatus(id string, ws store.SliceFlowStatus, as api.AllocationState) store.SliceWorkflow {
	h.t.Helper()
	w := h.workflow(id)
	if w.Status != ws {
		h.t.Fatalf("workflow %s: status %s (step %s, %s), want %s", id, w.Status, w.Step, w.Error, ws)
	}
	if a := h.alloc(id); a.State != as {
		h.t.Fatalf("allocation %s: state %s (%s), want %s", id, a.State, a.StateReason, as)
	}
	return w
}

// userOutput is allocation.provision_user's output from the guest.
func userOutput() map[string]any {
	return map[string]any{"vm_name": "slice-x", "allocation_id": "x",
		"user": map[string]any{"username": "alice", "uid": 1000, "created": false, "keys": 1}}
}

// provisioned answers the workflow's queued slice.vm_provision (ready)
// and then its allocation.provision_user, each with its event.
func (h *harness) provisioned() {
	h.t.Helper()
	prov := h.queued(task.TypeVMProvision)
	if len(prov) != 1 {
		h.t.Fatalf("%d queued provision tasks", len(prov))
	}
	h.answer(prov[0].ID, true, readyOutput(), true)
	h.answerUser(true, true)
}

// answerUser answers the one queued allocation.provision_user.
func (h *harness) answerUser(ok, publish bool) store.Task {
	h.t.Helper()
	us := h.queued(task.TypeAllocProvisionUser)
	if len(us) != 1 {
		h.t.Fatalf("%d queued provision_user tasks", len(us))
	}
	h.answer(us[0].ID, ok, userOutput(), publish)
	return us[0]
}
