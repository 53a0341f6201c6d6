package sliceflow

import (
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// skip moves the fake clock forward by d.
func (c *clock) skip(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestSweep: the sweep leaves a wait within its bound alone, advances a
// workflow whose task event was lost, fails a provision that never
// answered (slice_workflow_stuck, compensated: release queued, leases
// freed) and ends a release that never answered (leases freed).
func TestSweep(t *testing.T) {
	t.Run("within the bound", func(t *testing.T) {
		h := newHarness(t, 0)
		if err := h.create("alc_s", 1); err != nil {
			t.Fatal(err)
		}
		h.clk.skip(StuckAfter - time.Minute)
		if err := h.room.Sweep(h.ctx); err != nil {
			t.Fatal(err)
		}
		if w := h.wantStatus("alc_s", store.SliceFlowProvisioning, api.AllocationProvisioning); w.Step != StepAwaitProvision {
			t.Fatalf("step %s", w.Step)
		}
	})
	t.Run("lost event", func(t *testing.T) {
		h := newHarness(t, 0)
		if err := h.create("alc_s", 1); err != nil {
			t.Fatal(err)
		}
		h.answer(h.queued(task.TypeVMProvision)[0].ID, true, readyOutput(), false)
		if err := h.room.Sweep(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.answerUser(true, false)
		if err := h.room.Sweep(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.wantStatus("alc_s", store.SliceFlowActive, api.AllocationActive)
	})
	t.Run("provision never answered", func(t *testing.T) {
		h := newHarness(t, 0, 0)
		if err := h.create("alc_s", 2); err != nil {
			t.Fatal(err)
		}
		h.clk.skip(StuckAfter + time.Minute)
		h.restart() // a new control plane: no event will come
		if err := h.room.Sweep(h.ctx); err != nil {
			t.Fatal(err)
		}
		w := h.wantStatus("alc_s", store.SliceFlowCompensating, api.AllocationProvisioning)
		if w.Signal != string(signal.SliceWorkflowStuck) || !strings.Contains(w.Error, "no result for") {
			t.Fatalf("signal %s, error %q", w.Signal, w.Error)
		}
		rel := h.queued(task.TypeVMRelease)
		if len(rel) != 1 {
			t.Fatalf("%d release tasks", len(rel))
		}
		h.answer(rel[0].ID, true, map[string]any{}, true)
		h.failedWith("alc_s", StepAwaitProvision, signal.SliceWorkflowStuck)
	})
	t.Run("release never answered", func(t *testing.T) {
		h := newHarness(t, 0)
		if err := h.create("alc_s", 1); err != nil {
			t.Fatal(err)
		}
		h.provisioned()
		h.wantStatus("alc_s", store.SliceFlowActive, api.AllocationActive)
		if _, err := h.room.Release(h.ctx, "alc_s"); err != nil {
			t.Fatal(err)
		}
		if err := h.room.Sweep(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.wantStatus("alc_s", store.SliceFlowReleasing, api.AllocationReleasing)
		h.clk.skip(StuckAfter + time.Minute)
		if err := h.room.Sweep(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.wantStatus("alc_s", store.SliceFlowReleased, api.AllocationReleased)
		if ls := h.leases(); len(ls) != 0 {
			t.Fatalf("leaked leases %+v", ls)
		}
		var rec store.SliceStep
		steps, _ := h.st.ListSliceSteps(h.ctx, "alc_s")
		for _, s := range steps {
			if s.Step == StepAwaitRelease {
				rec = s
			}
		}
		if rec.State != store.SliceStepDone || !strings.Contains(rec.Detail, "never answered") {
			t.Fatalf("await_release %+v", rec)
		}
	})
}
