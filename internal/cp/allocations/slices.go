package allocations

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// SliceValidator checks a slice allocation request's fields
// (sliceflow.Validate).
type SliceValidator func(api.CreateAllocationRequest) []api.FieldError

// isSlice reports whether a is a slice allocation: its spec asks for slots.
func isSlice(a store.Allocation) bool { return a.IsSlice() }

// createSlice is POST /api/v1/allocations for a slice allocation: the host
// is placed (or checked) here, the allocation stored provisioning, and the
// workflow (sliceflow) takes it from there.
func (s *Room) createSlice(w http.ResponseWriter, r *http.Request, req api.CreateAllocationRequest, a store.Allocation) error {
	ctx := r.Context()
	if s.slices == nil {
		return httpapi.Errorf(http.StatusNotImplemented, "slices_unavailable", "this control plane runs no slice workflow")
	}
	if fe := s.validateSlice(req); len(fe) > 0 {
		return httpapi.Invalid(fe)
	}
	host, ok, err := s.slices.Place(ctx, req.HostID, req.Slots)
	if err != nil {
		return httpapi.StoreError(err, "host", req.HostID)
	}
	if !ok {
		where := "any host"
		if req.HostID != "" {
			where = "host " + req.HostID
		}
		return httpapi.Errorf(http.StatusConflict, "insufficient_slots", "%s has fewer than %d free approved slots", where, req.Slots)
	}
	spec, _ := json.Marshal(req)
	a.HostID, a.State, a.Spec = host, api.AllocationProvisioning, spec
	if err := s.store.CreateAllocation(ctx, a, s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "allocation.create",
		Target: a.ID, Result: string(a.State), CID: httpapi.CorrelationID(ctx),
		Detail: fmt.Sprintf("user=%s host=%s slots=%d", a.Username, a.HostID, req.Slots)})); err != nil {
		return err
	}
	if err := s.slices.Start(ctx, a); err != nil {
		// The workflow is recorded as far as it got and resumes on the
		// next task event or control plane start.
		s.log.Warn("slice workflow start", "allocation_id", a.ID, "err", err, "correlation_id", httpapi.CorrelationID(ctx))
	}
	if cur, err := s.store.GetAllocation(ctx, a.ID); err == nil {
		a = cur
	}
	v := allocationView(a)
	v.Workflow, _ = s.slices.View(ctx, a.ID)
	httpapi.WriteJSON(w, http.StatusCreated, v)
	return nil
}

func (s *Room) validateSlice(req api.CreateAllocationRequest) []api.FieldError {
	if s.validate == nil {
		return nil
	}
	return s.validate(req)
}

// releaseSlice is DELETE /api/v1/allocations/{id} for a slice allocation.
func (s *Room) releaseSlice(w http.ResponseWriter, r *http.Request, id string) error {
	ctx := r.Context()
	a, err := s.slices.Release(ctx, id)
	if err != nil {
		return httpapi.StoreError(err, "allocation", id)
	}
	s.terms.CloseAllocation(id)
	s.audit.Record(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "allocation.release", Target: a.ID, Result: string(a.State),
		CID: httpapi.CorrelationID(ctx)})
	v := allocationView(a)
	v.Workflow, _ = s.slices.View(ctx, a.ID)
	httpapi.WriteJSON(w, http.StatusAccepted, v)
	return nil
}
