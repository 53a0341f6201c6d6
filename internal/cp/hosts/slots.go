package hosts

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// topologyTaskType is the discovery task whose candidates can be approved.
const topologyTaskType = "slice.topology_discover"

// topologyOutput is the part of a slice.topology_discover result that
// approval reads. Candidates are kept raw: they are stored as discovered.
type topologyOutput struct {
	CandidateSlots   []json.RawMessage `json:"candidate_slots"`
	CandidateSummary struct {
		Blockers []struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			SlotIndex *int   `json:"slot_index"`
		} `json:"blockers"`
	} `json:"candidate_summary"`
	ApprovalRequired bool `json:"approval_required"`
}

// candidateIndex reads slot_index (and slot_id, if the candidate has one).
func candidateIndex(raw json.RawMessage) (int, string, error) {
	var c struct {
		SlotIndex *int   `json:"slot_index"`
		SlotID    string `json:"slot_id"`
	}
	if err := json.Unmarshal(raw, &c); err != nil || c.SlotIndex == nil {
		return 0, "", fmt.Errorf("candidate slot without slot_index: %s", raw)
	}
	id := c.SlotID
	if id == "" {
		id = fmt.Sprintf("slot-%d", *c.SlotIndex)
	}
	return *c.SlotIndex, id, nil
}

// approveSlots turns candidate slots of a succeeded discovery task into
// approved node resource slots. Slots with blockers (their own or
// host-wide) are refused with 409 naming every blocker.
func (s *Room) ApproveSlots(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	hostID := r.PathValue("id")
	var req api.ApproveSlotsRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.TaskID == "" {
		return httpapi.Invalid([]api.FieldError{{Field: "task_id", Message: "required: the slice.topology_discover task to approve from"}})
	}
	if !req.All && len(req.SlotIndexes) == 0 {
		return httpapi.Invalid([]api.FieldError{{Field: "slot_indexes", Message: "name the slots to approve, or set all"}})
	}
	t, err := s.store.GetTask(ctx, req.TaskID)
	if err != nil {
		return httpapi.StoreError(err, "task", req.TaskID)
	}
	switch {
	case t.NodeID != hostID:
		return httpapi.Invalid([]api.FieldError{{Field: "task_id", Message: fmt.Sprintf("task ran on %q, not %q", t.NodeID, hostID)}})
	case t.Type != topologyTaskType:
		return httpapi.Invalid([]api.FieldError{{Field: "task_id", Message: fmt.Sprintf("task is %s, want %s", t.Type, topologyTaskType)}})
	case t.State != api.TaskSucceeded:
		return httpapi.Errorf(http.StatusConflict, "task_not_succeeded", "discovery task %s is %s", t.ID, t.State)
	}
	var res api.TaskResult
	var out topologyOutput
	if err := json.Unmarshal(t.Result, &res); err != nil || json.Unmarshal(res.Output, &out) != nil {
		return httpapi.Errorf(http.StatusConflict, "task_output_invalid", "discovery task %s has no readable output", t.ID)
	}
	byIndex := map[int]json.RawMessage{}
	var order []int
	for _, c := range out.CandidateSlots {
		i, _, err := candidateIndex(c)
		if err != nil {
			return httpapi.Errorf(http.StatusConflict, "task_output_invalid", "%v", err)
		}
		byIndex[i] = c
		order = append(order, i)
	}
	want := req.SlotIndexes
	if req.All {
		want = order
	}
	if len(want) == 0 {
		return httpapi.Errorf(http.StatusConflict, "no_candidate_slots", "discovery task %s proposed no slots", t.ID)
	}
	var blockers []string
	for _, b := range out.CandidateSummary.Blockers {
		if b.SlotIndex == nil || slices.Contains(want, *b.SlotIndex) {
			where := "host"
			if b.SlotIndex != nil {
				where = fmt.Sprintf("slot %d", *b.SlotIndex)
			}
			blockers = append(blockers, fmt.Sprintf("%s: %s (%s)", where, b.Code, b.Message))
		}
	}
	if len(blockers) > 0 {
		return httpapi.Errorf(http.StatusConflict, "slot_blocked", "slots cannot be approved: %s", strings.Join(blockers, "; "))
	}
	var slots []store.Slot
	for _, i := range want {
		c, ok := byIndex[i]
		if !ok {
			return httpapi.Invalid([]api.FieldError{{Field: "slot_indexes", Message: fmt.Sprintf("task %s has no candidate slot %d", t.ID, i)}})
		}
		_, id, _ := candidateIndex(c)
		slots = append(slots, store.Slot{HostID: hostID, SlotID: id, Index: i, Spec: c, SourceTask: t.ID,
			ApprovedBy: httpapi.Actor(ctx), ApprovedAt: s.cfg.Now().UTC()})
	}
	records := make([]store.AuditEvent, 0, len(slots))
	for _, sl := range slots {
		records = append(records, s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "slot.approve",
			Target: hostID + "/" + sl.SlotID, Result: "ok", CID: httpapi.CorrelationID(ctx), Detail: "task=" + t.ID}))
	}
	if err := s.store.ApproveSlots(ctx, slots, records...); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return httpapi.Errorf(http.StatusConflict, "slot_exists", "%v", err)
		}
		return err
	}
	return s.ListSlots(w, r)
}

func slotView(sl store.Slot) api.Slot {
	return api.Slot{HostID: sl.HostID, SlotID: sl.SlotID, Index: sl.Index, Spec: sl.Spec,
		SourceTask: sl.SourceTask, ApprovedBy: sl.ApprovedBy, ApprovedAt: sl.ApprovedAt}
}

func (s *Room) ListSlots(w http.ResponseWriter, r *http.Request) error {
	hostID := r.PathValue("id")
	if _, err := s.store.GetHost(r.Context(), hostID); err != nil {
		return httpapi.StoreError(err, "host", hostID)
	}
	slots, err := s.store.ListSlots(r.Context(), hostID)
	if err != nil {
		return err
	}
	out := make([]api.Slot, 0, len(slots))
	for _, sl := range slots {
		out = append(out, slotView(sl))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Room) DeleteSlot(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	hostID, slotID := r.PathValue("id"), r.PathValue("slot_id")
	record := s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "slot.delete", Target: hostID + "/" + slotID,
		Result: "ok", CID: httpapi.CorrelationID(ctx)})
	if err := s.store.DeleteSlot(ctx, hostID, slotID, record); err != nil {
		return httpapi.StoreError(err, "slot", hostID+"/"+slotID)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
