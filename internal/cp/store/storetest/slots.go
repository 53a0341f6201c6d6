package storetest

import (
	"encoding/json"
	"testing"

	"github.com/drover-dev/drover/internal/cp/store"
)

var slotCases = []testCase{
	{"slots/approve list delete", func(t *testing.T, s store.Store) {
		ctx := ctxT(t)
		must(t, s.CreateHost(ctx, newHost("h1")))
		slots := []store.Slot{
			{HostID: "h1", SlotID: "slot-1", Index: 1, Spec: json.RawMessage(`{"gpu":"0000:02:00.0"}`), SourceTask: "t1", ApprovedBy: "operator:x", ApprovedAt: at(0)},
			{HostID: "h1", SlotID: "slot-0", Index: 0, Spec: json.RawMessage(`{"gpu":"0000:01:00.0"}`), SourceTask: "t1", ApprovedBy: "operator:x", ApprovedAt: at(0)},
		}
		must(t, s.ApproveSlots(ctx, slots))
		got, err := s.ListSlots(ctx, "h1")
		must(t, err)
		diff(t, "slots", got, []store.Slot{slots[1], slots[0]})
		if other, err := s.ListSlots(ctx, "h2"); err != nil || len(other) != 0 {
			t.Fatalf("other host: %v, %v", other, err)
		}
		must(t, s.DeleteSlot(ctx, "h1", "slot-0"))
		wantErr(t, s.DeleteSlot(ctx, "h1", "slot-0"), store.ErrNotFound)
	}},
	{"slots/approve is atomic", func(t *testing.T, s store.Store) {
		ctx := ctxT(t)
		must(t, s.ApproveSlots(ctx, []store.Slot{{HostID: "h1", SlotID: "a", ApprovedAt: at(0)}}))
		err := s.ApproveSlots(ctx, []store.Slot{{HostID: "h1", SlotID: "b", Index: 1, ApprovedAt: at(0)}, {HostID: "h1", SlotID: "a", ApprovedAt: at(0)}})
		wantErr(t, err, store.ErrConflict)
		got, err := s.ListSlots(ctx, "h1")
		must(t, err)
		if len(got) != 1 || got[0].SlotID != "a" {
			t.Fatalf("after a failed batch: %+v, want only slot a", got)
		}
	}}, {"slots/audited", func(t *testing.T, s store.Store) {
		ctx := ctxT(t)
		must(t, s.ApproveSlots(ctx, []store.Slot{{HostID: "h1", SlotID: "a", ApprovedAt: at(0)}}, auditRecord("slot.approve", "h1/a")))
		wantErr(t, s.ApproveSlots(ctx, []store.Slot{{HostID: "h1", SlotID: "b", Index: 1, ApprovedAt: at(0)}, {HostID: "h1", SlotID: "a", ApprovedAt: at(0)}},
			auditRecord("slot.approve", "h1/b"), auditRecord("slot.approve", "h1/a")), store.ErrConflict)
		must(t, s.DeleteSlot(ctx, "h1", "a", auditRecord("slot.delete", "h1/a")))
		wantErr(t, s.DeleteSlot(ctx, "h1", "a", auditRecord("slot.delete", "h1/a")), store.ErrNotFound)
		diff(t, "h1/a records", recordsOf(t, s, "h1/a"), []string{"slot.approve", "slot.delete"})
		diff(t, "records of a refused approval", recordsOf(t, s, "h1/b"), []string(nil))
	}},
}
