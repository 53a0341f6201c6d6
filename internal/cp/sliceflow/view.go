package sliceflow

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// View is a slice allocation's workflow as the API shows it: its steps
// with their timings, the leased slots, the provision task's phases (live
// from its events while it runs, from its result once it finished) and
// the VM.
func (s *Room) View(ctx context.Context, id string) (*api.SliceWorkflow, error) {
	w, err := s.store.GetSliceWorkflow(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("sliceflow %s: view: %w", id, err)
	}
	steps, err := s.store.ListSliceSteps(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("sliceflow %s (correlation_id %s): view: %w", id, w.CorrelationID, err)
	}
	p, _ := planOf(w)
	v := &api.SliceWorkflow{Status: string(w.Status), Step: w.Step, VMName: p.VMName, NUMA: p.NUMA,
		ProvisionTaskID: w.ProvisionTaskID, ReleaseTaskID: w.ReleaseTaskID, FailedStep: w.FailedStep,
		Signal: w.Signal, Error: w.Error, CorrelationID: w.CorrelationID, Steps: []api.SliceWorkflowStep{}}
	for _, sl := range p.Slots {
		v.Slots = append(v.Slots, api.SliceSlot{SlotID: sl.SlotID, SlotIndex: sl.SlotIndex, PCIAddress: sl.PCIAddress,
			FabricDevice: sl.FabricDevice, NVMeDevice: sl.NVMeDevice, NUMANode: sl.NUMANode, VCPUCount: sl.VCPUCount,
			MemoryMiB: sl.MemoryMiB, MACAddress: sl.MACAddress, PrivateIP: sl.PrivateIP})
	}
	now := s.now().UTC()
	for _, st := range steps {
		vs := api.SliceWorkflowStep{Step: st.Step, State: st.State, IdempotencyKey: st.Key, TaskID: st.TaskID,
			Detail: st.Detail, StartedAt: st.StartedAt}
		end := now
		if !st.EndedAt.IsZero() {
			e := st.EndedAt
			vs.EndedAt, end = &e, e
		}
		vs.DurationMS = end.Sub(st.StartedAt).Milliseconds()
		v.Steps = append(v.Steps, vs)
	}
	if len(w.Result) > 0 {
		var vm api.SliceVM
		if json.Unmarshal(w.Result, &vm) == nil {
			v.VM = &vm
		}
	}
	if w.ProvisionTaskID != "" {
		v.Phases = s.phases(ctx, w.ProvisionTaskID)
	}
	return v, nil
}

// phases are a provision task's phases: its result's when it has one,
// else its live events (one per phase, the last state wins).
func (s *Room) phases(ctx context.Context, taskID string) []api.SlicePhase {
	if t, res, err := s.finished(ctx, taskID); err == nil && t != nil && res != nil {
		var out provisionOutput
		if json.Unmarshal(res.Output, &out) == nil && len(out.Phases) > 0 {
			return out.Phases
		}
	}
	evs, err := s.store.ListTaskEvents(ctx, taskID)
	if err != nil {
		return nil
	}
	var out []api.SlicePhase
	idx := map[string]int{}
	for _, e := range evs {
		var te api.TaskEvent
		if json.Unmarshal(e.Event, &te) != nil || te.Phase == "" {
			continue
		}
		ph := api.SlicePhase{Phase: te.Phase, Status: te.Status, DurationMS: te.DurationMS, Detail: te.Message}
		if i, ok := idx[te.Phase]; ok {
			out[i] = ph
			continue
		}
		idx[te.Phase] = len(out)
		out = append(out, ph)
	}
	return out
}

// IsSlice reports whether an allocation is a slice allocation (its spec
// asks for slots).
func IsSlice(a store.Allocation) bool {
	var req api.SliceRequest
	return len(a.Spec) > 0 && json.Unmarshal(a.Spec, &req) == nil && req.Slots > 0
}
