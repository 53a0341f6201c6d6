package storetest

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

var sliceCases = []testCase{
	{"slices/workflow create get update list", func(t *testing.T, s store.Store) {
		ctx := ctxT(t)
		w := store.SliceWorkflow{AllocationID: "alc_1", HostID: "h1", Spec: json.RawMessage(`{"slots":2}`),
			CorrelationID: "cid-1", CreatedAt: at(0)}
		must(t, s.CreateSliceWorkflow(ctx, w))
		wantErr(t, s.CreateSliceWorkflow(ctx, w), store.ErrConflict)
		got, err := s.GetSliceWorkflow(ctx, "alc_1")
		must(t, err)
		w.Status, w.UpdatedAt = store.SliceFlowProvisioning, at(0)
		diff(t, "workflow", got, w)
		_, err = s.GetSliceWorkflow(ctx, "nope")
		wantErr(t, err, store.ErrNotFound)
		up, err := s.UpdateSliceWorkflow(ctx, "alc_1", func(w *store.SliceWorkflow) error {
			w.Status, w.Step, w.Plan, w.ReleaseRequested, w.UpdatedAt = store.SliceFlowActive, "activate", json.RawMessage(`{"vm_name":"v"}`), true, at(time.Second)
			return nil
		})
		must(t, err)
		if up.Status != store.SliceFlowActive || !up.ReleaseRequested || string(up.Plan) != `{"vm_name":"v"}` || !up.UpdatedAt.Equal(at(time.Second)) {
			t.Fatalf("updated: %+v", up)
		}
		boom := errors.New("boom")
		if _, err := s.UpdateSliceWorkflow(ctx, "alc_1", func(*store.SliceWorkflow) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("fn error: %v", err)
		}
		_, err = s.UpdateSliceWorkflow(ctx, "nope", func(*store.SliceWorkflow) error { return nil })
		wantErr(t, err, store.ErrNotFound)
		must(t, s.CreateSliceWorkflow(ctx, store.SliceWorkflow{AllocationID: "alc_2", CreatedAt: at(time.Minute)}))
		all, err := s.ListSliceWorkflows(ctx, false)
		must(t, err)
		open, err := s.ListSliceWorkflows(ctx, true)
		must(t, err)
		if len(all) != 2 || all[0].AllocationID != "alc_1" || len(open) != 1 || open[0].AllocationID != "alc_2" {
			t.Fatalf("all %+v, unfinished %+v", all, open)
		}
	}},
	{"slices/steps are recorded once by key", func(t *testing.T, s store.Store) {
		ctx := ctxT(t)
		k := store.SliceStepKey("alc_1", "lease_slots")
		st, created, err := s.BeginSliceStep(ctx, store.SliceStep{Key: k, AllocationID: "alc_1", Step: "lease_slots", StartedAt: at(0)})
		must(t, err)
		if !created || st.State != store.SliceStepStarted || st.Seq != 1 {
			t.Fatalf("first begin: %+v %v", st, created)
		}
		again, created, err := s.BeginSliceStep(ctx, store.SliceStep{Key: k, AllocationID: "alc_1", Step: "lease_slots", StartedAt: at(time.Hour)})
		must(t, err)
		if created || !again.StartedAt.Equal(at(0)) {
			t.Fatalf("second begin recorded again: %+v", again)
		}
		st.State, st.Detail, st.TaskID, st.EndedAt = store.SliceStepDone, "2 slots", "tsk_1", at(time.Second)
		must(t, s.UpdateSliceStep(ctx, st))
		wantErr(t, s.UpdateSliceStep(ctx, store.SliceStep{Key: "alc_1/none"}), store.ErrNotFound)
		k2 := store.SliceStepKey("alc_1", "vm_provision")
		_, _, err = s.BeginSliceStep(ctx, store.SliceStep{Key: k2, AllocationID: "alc_1", Step: "vm_provision", StartedAt: at(2 * time.Second)})
		must(t, err)
		_, _, err = s.BeginSliceStep(ctx, store.SliceStep{Key: "alc_2/lease_slots", AllocationID: "alc_2", Step: "lease_slots", StartedAt: at(0)})
		must(t, err)
		steps, err := s.ListSliceSteps(ctx, "alc_1")
		must(t, err)
		diff(t, "steps", steps, []store.SliceStep{
			{Key: k, AllocationID: "alc_1", Step: "lease_slots", Seq: 1, State: store.SliceStepDone, TaskID: "tsk_1", Detail: "2 slots", StartedAt: at(0), EndedAt: at(time.Second)},
			{Key: k2, AllocationID: "alc_1", Step: "vm_provision", Seq: 2, State: store.SliceStepStarted, StartedAt: at(2 * time.Second)},
		})
	}},
	{"slices/slot leases are exclusive and atomic", func(t *testing.T, s store.Store) {
		ctx := ctxT(t)
		must(t, s.LeaseSlots(ctx, "alc_1", "h1", []string{"slot-0", "slot-1"}, at(0)))
		must(t, s.LeaseSlots(ctx, "alc_1", "h1", []string{"slot-0", "slot-1"}, at(time.Second))) // idempotent
		wantErr(t, s.LeaseSlots(ctx, "alc_2", "h1", []string{"slot-2", "slot-1"}, at(0)), store.ErrConflict)
		must(t, s.LeaseSlots(ctx, "alc_2", "h2", []string{"slot-1"}, at(0))) // another host's slot-1
		ls, err := s.ListSlotLeases(ctx, "h1")
		must(t, err)
		diff(t, "leases", ls, []store.SlotLease{
			{HostID: "h1", SlotID: "slot-0", AllocationID: "alc_1", LeasedAt: at(0)},
			{HostID: "h1", SlotID: "slot-1", AllocationID: "alc_1", LeasedAt: at(0)},
		})
		all, err := s.ListSlotLeases(ctx, "")
		must(t, err)
		if len(all) != 3 {
			t.Fatalf("all leases: %+v", all)
		}
		n, err := s.FreeSlotLeases(ctx, "alc_1")
		must(t, err)
		if n != 2 {
			t.Fatalf("freed %d, want 2", n)
		}
		if n, _ := s.FreeSlotLeases(ctx, "alc_1"); n != 0 {
			t.Fatalf("freed twice: %d", n)
		}
		must(t, s.LeaseSlots(ctx, "alc_2", "h1", []string{"slot-2", "slot-1"}, at(0)))
	}},
	{"slices/concurrent leases of the last slot: one wins", func(t *testing.T, s store.Store) {
		ctx := ctxT(t)
		const n = 8
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			wins int
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := s.LeaseSlots(ctx, "alc_"+string(rune('a'+i)), "h1", []string{"slot-9"}, at(0))
				switch {
				case err == nil:
					mu.Lock()
					wins++
					mu.Unlock()
				case !errors.Is(err, store.ErrConflict):
					t.Errorf("lease %d: %v, want nil or ErrConflict", i, err)
				}
			}()
		}
		wg.Wait()
		ls, err := s.ListSlotLeases(ctx, "h1")
		must(t, err)
		if wins != 1 || len(ls) != 1 {
			t.Fatalf("%d winners, leases %+v", wins, ls)
		}
	}},
}
