package sliceflow

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

func TestCreateActiveRelease(t *testing.T) {
	h := newHarness(t, 0, 1, 1)
	if err := h.create("alc_a", 2); err != nil {
		t.Fatal(err)
	}
	w := h.wantStatus("alc_a", store.SliceFlowProvisioning, api.AllocationProvisioning)
	if w.Step != StepAwaitProvision || w.ProvisionTaskID == "" {
		t.Fatalf("workflow waits at %s, task %q", w.Step, w.ProvisionTaskID)
	}
	prov := h.queued(task.TypeVMProvision)
	if len(prov) != 1 {
		t.Fatalf("%d provision tasks", len(prov))
	}
	p, fe := task.DecodeVMProvisionParams(prov[0].Params)
	if fe != nil {
		t.Fatalf("params: %v", fe)
	}
	// NUMA-aware: slots 1 and 2 share node 1.
	if len(p.Slots) != 2 || p.Slots[0].SlotID != "slot-1" || p.Slots[1].SlotID != "slot-2" || p.Slots[0].NUMANode != 1 ||
		p.Slots[0].MACAddress != "52:54:00:00:00:01" || p.Slots[0].PrivateIP != "10.77.0.11" || p.Slots[0].VCPUCount != 2 ||
		p.DefaultUsername != "alice" || p.ImageURL == "" || prov[0].CorrelationID != w.CorrelationID {
		t.Fatalf("provision params: %+v", p)
	}
	if a := h.alloc("alc_a"); a.ProvisionTaskID != prov[0].ID {
		t.Fatalf("allocation provision task %q", a.ProvisionTaskID)
	}
	h.answer(prov[0].ID, true, readyOutput(), true)
	// provision_user: allocation.provision_user in the guest, awaited.
	if w := h.wantStatus("alc_a", store.SliceFlowProvisioning, api.AllocationProvisioning); w.Step != StepProvisionUser {
		t.Fatalf("workflow at %s, want %s", w.Step, StepProvisionUser)
	}
	us := h.queued(task.TypeAllocProvisionUser)
	if len(us) != 1 {
		t.Fatalf("%d provision_user tasks", len(us))
	}
	up, fe := task.DecodeAllocProvisionUserParams(us[0].Params)
	if fe != nil || up.VMName != p.VMName || up.Username != "alice" || up.AllocationID != "alc_a" ||
		us[0].CorrelationID != w.CorrelationID || us[0].NodeID != "h1" {
		t.Fatalf("provision_user %+v %v (task %+v)", up, fe, us[0])
	}
	h.answer(us[0].ID, true, userOutput(), true)
	h.wantStatus("alc_a", store.SliceFlowActive, api.AllocationActive)
	states := h.stepStates("alc_a")
	for _, s := range []string{StepLeaseSlots, StepVMProvision, StepAwaitProvision, StepRecordResult, StepProvisionUser, StepActivate} {
		if states[s] != store.SliceStepDone {
			t.Errorf("step %s: %q", s, states[s])
		}
	}
	v, err := h.room.View(h.ctx, "alc_a")
	if err != nil {
		t.Fatal(err)
	}
	if v.VM == nil || v.VM.PrivateIP != "10.77.0.10" || !v.VM.Ready || v.VM.ConsoleModel != "gateway_required" || len(v.Phases) != 2 ||
		len(v.Steps) != 6 || v.Steps[0].IdempotencyKey != "alc_a/lease_slots" || v.Steps[0].EndedAt == nil || v.NUMA != "node 1" {
		t.Fatalf("view: %+v", v)
	}
	if len(h.leases()) != 2 {
		t.Fatalf("leases: %+v", h.leases())
	}

	if _, err := h.room.Release(h.ctx, "alc_a"); err != nil {
		t.Fatal(err)
	}
	h.wantStatus("alc_a", store.SliceFlowReleasing, api.AllocationReleasing)
	rel := h.queued(task.TypeVMRelease)
	if len(rel) != 1 {
		t.Fatalf("%d release tasks", len(rel))
	}
	rp, fe := task.DecodeVMReleaseParams(rel[0].Params)
	if fe != nil || !rp.Wipe || rp.VMName != p.VMName || len(rp.Slots) != 2 || rp.AllocationID != "alc_a" {
		t.Fatalf("release params %+v %v", rp, fe)
	}
	h.answer(rel[0].ID, true, map[string]any{}, true)
	h.wantStatus("alc_a", store.SliceFlowReleased, api.AllocationReleased)
	if len(h.leases()) != 0 {
		t.Fatalf("leases after release: %+v", h.leases())
	}
	if _, err := h.room.Release(h.ctx, "alc_a"); err != nil { // twice is fine
		t.Fatal(err)
	}
	if n := len(h.all(task.TypeVMRelease)); n != 1 {
		t.Fatalf("%d release tasks after a second release", n)
	}
	// Each state the workflow gave the allocation was stored with its
	// record.
	evs, err := h.st.ListAudit(h.ctx, store.AuditFilter{Target: "alc_a", Action: "allocation.state"})
	if err != nil {
		t.Fatal(err)
	}
	var recorded []string
	for _, e := range slices.Backward(evs) {
		recorded = append(recorded, e.Result)
	}
	if want := []string{"provisioning", "active", "releasing", "released"}; !slices.Equal(recorded, want) {
		t.Errorf("allocation.state records %v, want %v", recorded, want)
	}
}

var errCrash = errors.New("crash")

// TestResumeAtEveryBoundary stops the control plane at each step boundary
// (after a step is recorded, before its side effect; and after it is
// recorded done), restarts it and resumes: the workflow ends active, then
// released, with one task of each kind and no leaked lease.
func TestResumeAtEveryBoundary(t *testing.T) {
	var points []string
	for _, s := range []string{StepLeaseSlots, StepVMProvision, StepAwaitProvision, StepRecordResult, StepProvisionUser, StepActivate,
		StepReleaseVM, StepAwaitRelease, StepFreeLeases} {
		points = append(points, "begin:"+s, "done:"+s)
	}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			h := newHarness(t, 0, 0)
			crashed := false
			h.room.hook = func(p string) error {
				if p == point && !crashed {
					crashed = true
					return errCrash
				}
				return nil
			}
			drive := func() {
				for range 10 {
					w := h.workflow("alc_r")
					if w.Status.Finished() {
						return
					}
					if crashed && h.room.hook != nil {
						h.restart() // the crashed replica is gone; a new one resumes
						if err := h.room.Resume(h.ctx); err != nil {
							t.Fatal(err)
						}
						continue
					}
					queued := append(h.queued(task.TypeVMProvision), h.queued(task.TypeVMRelease)...)
					for _, q := range append(queued, h.queued(task.TypeAllocProvisionUser)...) {
						out := any(map[string]any{})
						if q.Type == task.TypeVMProvision {
							out = readyOutput()
						}
						h.answer(q.ID, true, out, true)
					}
				}
			}
			if err := h.create("alc_r", 2); err != nil && !errors.Is(err, errCrash) {
				t.Fatal(err)
			}
			drive()
			h.wantStatus("alc_r", store.SliceFlowActive, api.AllocationActive)
			if _, err := h.room.Release(h.ctx, "alc_r"); err != nil && !errors.Is(err, errCrash) {
				t.Fatal(err)
			}
			drive()
			h.wantStatus("alc_r", store.SliceFlowReleased, api.AllocationReleased)
			if !crashed {
				t.Fatalf("never reached %s", point)
			}
			if n, u, m := len(h.all(task.TypeVMProvision)), len(h.all(task.TypeAllocProvisionUser)), len(h.all(task.TypeVMRelease)); n != 1 || u != 1 || m != 1 {
				t.Fatalf("%d provision, %d provision_user and %d release tasks, want one each", n, u, m)
			}
			if ls := h.leases(); len(ls) != 0 {
				t.Fatalf("leaked leases: %+v", ls)
			}
		})
	}
}

// A result that arrives while no control plane runs (no event) is picked
// up by Resume.
func TestResumeReadsResultWithoutEvent(t *testing.T) {
	h := newHarness(t, 0)
	if err := h.create("alc_q", 1); err != nil {
		t.Fatal(err)
	}
	h.answer(h.queued(task.TypeVMProvision)[0].ID, true, readyOutput(), false)
	h.wantStatus("alc_q", store.SliceFlowProvisioning, api.AllocationProvisioning)
	h.restart()
	if err := h.room.Resume(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.answerUser(true, false)
	h.wantStatus("alc_q", store.SliceFlowProvisioning, api.AllocationProvisioning)
	h.restart()
	if err := h.room.Resume(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.wantStatus("alc_q", store.SliceFlowActive, api.AllocationActive)
}

// failedWith checks a compensated workflow: failed at step with sig, the
// reason naming step, signal and correlation id, and no leases left.
func (h *harness) failedWith(id, step string, sig signal.Name) {
	h.t.Helper()
	w := h.wantStatus(id, store.SliceFlowFailed, api.AllocationFailed)
	if w.FailedStep != step || w.Signal != string(sig) {
		h.t.Fatalf("failed at %s with %s (%s), want %s with %s", w.FailedStep, w.Signal, w.Error, step, sig)
	}
	r := h.alloc(id).StateReason
	if !strings.Contains(r, step) || !strings.Contains(r, string(sig)) || !strings.Contains(r, w.CorrelationID) {
		h.t.Fatalf("state reason %q", r)
	}
	if ls := h.leases(); len(ls) != 0 {
		h.t.Fatalf("leaked leases: %+v", ls)
	}
	if h.stepStates(id)[step] != store.SliceStepFailed {
		h.t.Fatalf("step %s not recorded failed: %v", step, h.stepStates(id))
	}
}

func TestCompensation(t *testing.T) {
	t.Run("lease_slots", func(t *testing.T) {
		h := newHarness(t, 0)
		if err := h.create("alc_c", 2); err != nil {
			t.Fatal(err)
		}
		h.failedWith("alc_c", StepLeaseSlots, signal.SliceSlotsUnavailable)
		if n := len(h.all(task.TypeVMRelease)); n != 0 {
			t.Fatalf("%d release tasks for a VM never asked for", n)
		}
	})
	t.Run("vm_provision params refused", func(t *testing.T) {
		h := newHarness(t, 0)
		h.room.hook = func(p string) error {
			if p == "done:"+StepLeaseSlots {
				_, err := h.st.UpdateSliceWorkflow(h.ctx, "alc_c", func(w *store.SliceWorkflow) error {
					w.Spec = []byte(strings.Replace(string(w.Spec), "https://", "gopher://", 1))
					return nil
				})
				return err
			}
			return nil
		}
		if err := h.create("alc_c", 1); err != nil {
			t.Fatal(err)
		}
		h.failedWith("alc_c", StepVMProvision, signal.SliceProvisionFailed)
		if n := len(h.all(task.TypeVMProvision)) + len(h.all(task.TypeVMRelease)); n != 0 {
			t.Fatalf("%d tasks", n)
		}
	})
	t.Run("vm_provision enqueue error resumes", func(t *testing.T) {
		h := newHarness(t, 0)
		h.tasks.failEnqueue = true
		if err := h.create("alc_c", 1); err == nil || !strings.Contains(err.Error(), "correlation_id") {
			t.Fatalf("start: %v, want the enqueue error with the correlation id", err)
		}
		h.wantStatus("alc_c", store.SliceFlowProvisioning, api.AllocationProvisioning)
		h.tasks.failEnqueue = false
		h.restart()
		if err := h.room.Resume(h.ctx); err != nil {
			t.Fatal(err)
		}
		if n := len(h.queued(task.TypeVMProvision)); n != 1 {
			t.Fatalf("%d provision tasks after resume", n)
		}
	})
	for _, tc := range []struct {
		name   string
		finish func(h *harness, id string)
		step   string
	}{
		{"await_provision failed", func(h *harness, id string) {
			h.answer(id, false, map[string]any{"failed_phase": "vfio_bind_check"}, true)
		}, StepAwaitProvision},
		{"await_provision expired", func(h *harness, id string) {
			_, expired, err := h.st.ReapTasks(h.ctx, h.clk.now().Add(taskTTL+time.Hour), nil)
			if err != nil || len(expired) != 1 {
				h.t.Fatalf("reap: %v %v", expired, err)
			}
			h.bus.PublishFinished(h.ctx, taskbus.Finished{Task: expired[0]})
		}, StepAwaitProvision},
		{"record_result not ready", func(h *harness, id string) {
			out := readyOutput()
			out["readiness"] = map[string]any{"ready": false}
			h.answer(id, true, out, true)
		}, StepRecordResult},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0, 0)
			if err := h.create("alc_c", 2); err != nil {
				t.Fatal(err)
			}
			tc.finish(h, h.queued(task.TypeVMProvision)[0].ID)
			w := h.wantStatus("alc_c", store.SliceFlowCompensating, api.AllocationProvisioning)
			if len(h.leases()) != 2 || w.ReleaseTaskID == "" {
				t.Fatalf("compensating: leases %v, release task %q", h.leases(), w.ReleaseTaskID)
			}
			rel := h.queued(task.TypeVMRelease)
			if len(rel) != 1 {
				t.Fatalf("%d release tasks", len(rel))
			}
			h.answer(rel[0].ID, true, map[string]any{}, true)
			h.failedWith("alc_c", tc.step, signal.SliceProvisionFailed)
			if w := h.workflow("alc_c"); !strings.Contains(h.alloc("alc_c").StateReason, w.Error) {
				t.Fatalf("reason %q lacks %q", h.alloc("alc_c").StateReason, w.Error)
			}
		})
	}
}

// Two workflows race for the last slot: one leases it, the other fails
// cleanly at lease_slots; no lease leaks.
func TestLastSlotContention(t *testing.T) {
	h := newHarness(t, 0)
	var wg sync.WaitGroup
	for _, id := range []string{"alc_x", "alc_y"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.create(id, 1); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var won, lost string
	for _, id := range []string{"alc_x", "alc_y"} {
		switch h.workflow(id).Status {
		case store.SliceFlowProvisioning:
			won = id
		case store.SliceFlowFailed:
			lost = id
		}
	}
	if won == "" || lost == "" {
		t.Fatalf("x %s, y %s", h.workflow("alc_x").Status, h.workflow("alc_y").Status)
	}
	if ls := h.leases(); len(ls) != 1 || ls[0].AllocationID != won {
		t.Fatalf("leases %+v, want one for %s", ls, won)
	}
	if w := h.workflow(lost); w.FailedStep != StepLeaseSlots || w.Signal != string(signal.SliceSlotsUnavailable) {
		t.Fatalf("loser: %+v", w)
	}
}

// Released while provisioning: the workflow waits for the provision task
// and then releases what it made.
func TestReleaseWhileProvisioning(t *testing.T) {
	h := newHarness(t, 0)
	if err := h.create("alc_p", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := h.room.Release(h.ctx, "alc_p"); err != nil {
		t.Fatal(err)
	}
	h.wantStatus("alc_p", store.SliceFlowProvisioning, api.AllocationProvisioning)
	h.answer(h.queued(task.TypeVMProvision)[0].ID, true, readyOutput(), true)
	h.wantStatus("alc_p", store.SliceFlowReleasing, api.AllocationReleasing)
	h.answer(h.queued(task.TypeVMRelease)[0].ID, true, map[string]any{}, true)
	h.wantStatus("alc_p", store.SliceFlowReleased, api.AllocationReleased)
	if len(h.leases()) != 0 {
		t.Fatal("leaked lease")
	}
}

func TestChooseAndAddresses(t *testing.T) {
	mk := func(i, node int) freeSlot {
		return freeSlot{Slot: store.Slot{SlotID: fmt.Sprint("s", i), Index: i}, spec: slotSpec{NUMANode: intp(node)}}
	}
	got, numa := choose([]freeSlot{mk(0, 0), mk(1, 1), mk(2, 0), mk(3, 1), mk(4, 1)}, 2)
	if numa != "node 0" || got[0].SlotID != "s0" || got[1].SlotID != "s2" {
		t.Fatalf("best fit: %v %s", got, numa)
	}
	if _, numa := choose([]freeSlot{mk(0, 0), mk(1, 1)}, 2); numa != "spanning" {
		t.Fatalf("spanning: %s", numa)
	}
	if got, _ := choose([]freeSlot{mk(0, 0)}, 2); got != nil {
		t.Fatal("chose too few")
	}
	m1, ip1 := DeriveAddress("h1", "slot-0")
	m2, ip2 := DeriveAddress("h1", "slot-0")
	m3, _ := DeriveAddress("h1", "slot-1")
	if m1 != m2 || ip1 != ip2 || m1 == m3 || !strings.HasPrefix(m1, "52:54:00:") || !strings.HasPrefix(ip1, "10.77.") {
		t.Fatalf("addresses %s %s %s %s", m1, ip1, m2, m3)
	}
	if fe := Validate(api.CreateAllocationRequest{Username: "alice", SliceRequest: api.SliceRequest{Slots: 1, Image: "gopher://x", ImageSHA256: "no"}}); len(fe) != 2 ||
		fe[0].Field != "image" || fe[1].Field != "image_sha256" {
		t.Fatalf("validate: %+v", fe)
	}
}
