package sliceflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// leaseSlots leases the allocation's N slots on its host, exclusively in
// the store (NUMA-aware), and records the plan. Slots the allocation
// already holds (a lease_slots resumed after its lease) are its own.
func (s *Room) leaseSlots(ctx context.Context, w *store.SliceWorkflow, _ *store.SliceStep) (outcome, error) {
	req, err := specOf(*w)
	if err != nil {
		return outcome{}, err
	}
	for attempt := 0; ; attempt++ {
		free, err := s.freeSlots(ctx, w.HostID, w.AllocationID)
		if err != nil {
			return outcome{}, err
		}
		picked, numa := choose(free, req.Slots)
		if picked == nil {
			return outcome{kind: fail, signal: signal.SliceSlotsUnavailable,
				detail: fmt.Sprintf("host %s has %d free approved slots, %d asked", w.HostID, len(free), req.Slots)}, nil
		}
		ids := make([]string, len(picked))
		for i, f := range picked {
			ids[i] = f.SlotID
		}
		err = s.store.LeaseSlots(ctx, w.AllocationID, w.HostID, ids, s.now().UTC())
		if errors.Is(err, store.ErrConflict) {
			if attempt < 2 {
				continue // another workflow leased one meanwhile: look again
			}
			return outcome{kind: fail, signal: signal.SliceSlotsUnavailable,
				detail: fmt.Sprintf("slots of host %s were leased by another allocation: %v", w.HostID, err)}, nil
		}
		if err != nil {
			return outcome{}, err
		}
		p := plan{VMName: vmName(w.AllocationID), NUMA: numa}
		for _, f := range picked {
			p.Slots = append(p.Slots, vmSlot(w.HostID, f, req))
		}
		h, err := s.store.GetHost(ctx, w.HostID)
		if err != nil {
			return outcome{}, err
		}
		var netWhy string
		p.OVSBridge, netWhy = sliceNetwork(h, p.Slots)
		raw, _ := json.Marshal(p)
		if err := s.update(ctx, w, func(w *store.SliceWorkflow) { w.Plan = raw }); err != nil {
			return outcome{}, err
		}
		return outcome{detail: fmt.Sprintf("leased %s on %s (NUMA %s); %s", strings.Join(ids, ","), w.HostID, numa, netWhy)}, nil
	}
}

// provisionParams are the slice.vm_provision params of the plan.
func provisionParams(w store.SliceWorkflow, req api.CreateAllocationRequest, p plan) json.RawMessage {
	raw, _ := json.Marshal(task.VMProvisionParams{AllocationID: w.AllocationID, VMName: p.VMName, ImageURL: req.Image,
		ImageSHA256: req.ImageSHA256, DefaultUsername: req.Username, SSHPublicKeys: req.SSHAuthorizedKeys, Slots: p.Slots, OVSBridge: p.OVSBridge,
		Boot: req.Boot, ReadinessMarker: req.ReadinessMarker, ReadinessTimeoutSeconds: req.ReadinessTimeoutSeconds})
	return raw
}

// enqueueProvision queues slice.vm_provision with the leased slots' full
// parameters.
func (s *Room) enqueueProvision(ctx context.Context, w *store.SliceWorkflow, rec *store.SliceStep) (outcome, error) {
	req, err := specOf(*w)
	if err != nil {
		return outcome{}, err
	}
	p, err := planOf(*w)
	if err != nil {
		return outcome{}, err
	}
	params := provisionParams(*w, req, p)
	if _, fe := task.DecodeVMProvisionParams(params); len(fe) > 0 {
		return outcome{kind: fail, signal: signal.SliceProvisionFailed,
			detail: fmt.Sprintf("slice.vm_provision params refused: %s: %s", fe[0].Field, fe[0].Message)}, nil
	}
	id, err := s.enqueue(ctx, w, rec, task.TypeVMProvision, params)
	if err != nil {
		return outcome{}, err
	}
	if w.ProvisionTaskID != id {
		if err := s.update(ctx, w, func(w *store.SliceWorkflow) { w.ProvisionTaskID = id }); err != nil {
			return outcome{}, err
		}
		s.setAllocation(ctx, *w, api.AllocationProvisioning, "")
	}
	return outcome{detail: "queued " + id + " for " + w.HostID}, nil
}

// awaitProvision waits for the provision task's result (a task event
// advances the workflow; this reads the task once per advance).
func (s *Room) awaitProvision(ctx context.Context, w *store.SliceWorkflow, rec *store.SliceStep) (outcome, error) {
	if rec.TaskID != w.ProvisionTaskID {
		rec.TaskID = w.ProvisionTaskID
		if err := s.store.UpdateSliceStep(ctx, *rec); err != nil {
			return outcome{}, err
		}
	}
	t, res, err := s.finished(ctx, w.ProvisionTaskID)
	if errors.Is(err, store.ErrNotFound) {
		return missing(task.TypeVMProvision, w.ProvisionTaskID), nil
	}
	if err != nil {
		return outcome{kind: wait}, err
	}
	if t == nil {
		if detail, late := s.overdue(rec, task.TypeVMProvision, w.ProvisionTaskID); late {
			return outcome{kind: fail, signal: signal.SliceWorkflowStuck, detail: detail}, nil
		}
		return outcome{kind: wait}, nil
	}
	if t.State == api.TaskSucceeded {
		return outcome{detail: t.ID + " succeeded"}, nil
	}
	return outcome{kind: fail, signal: signal.SliceProvisionFailed, detail: taskFailure(*t, res)}, nil
}

// finished returns the task when it reached a final state (nil while it
// has not), with its decoded result when it has one.
func (s *Room) finished(ctx context.Context, id string) (*store.Task, *api.TaskResult, error) {
	t, err := s.store.GetTask(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if !t.State.Terminal() {
		return nil, nil, nil
	}
	var res *api.TaskResult
	if len(t.Result) > 0 {
		var r api.TaskResult
		if json.Unmarshal(t.Result, &r) == nil {
			res = &r
		}
	}
	return &t, res, nil
}

// provisionOutput is what the workflow reads of slice.vm_provision's
// output (internal/node/slicevm's ProvisionOutput).
type provisionOutput struct {
	DefaultUser string           `json:"default_user"`
	PrivateIP   string           `json:"private_ip"`
	SSHHost     string           `json:"ssh_host"`
	SSHPort     int              `json:"ssh_port"`
	Readiness   json.RawMessage  `json:"readiness"`
	Performance json.RawMessage  `json:"performance"`
	Timings     map[string]int64 `json:"timings"`
	RawVNC      bool             `json:"raw_vnc"`
	Console     string           `json:"console_model"`
	Phases      []api.SlicePhase `json:"phases"`
	FailedPhase string           `json:"failed_phase"`
}

func taskFailure(t store.Task, res *api.TaskResult) string {
	msg := fmt.Sprintf("%s %s", t.ID, t.State)
	if res == nil {
		return msg
	}
	var out provisionOutput
	if json.Unmarshal(res.Output, &out) == nil && out.FailedPhase != "" {
		msg += " at phase " + out.FailedPhase
	}
	if res.Error != nil {
		msg += ": " + res.Error.Code + ": " + res.Error.Message
	}
	return msg
}

// recordResult records the VM's address, readiness and performance; a VM
// the node did not find ready fails the step (and is released).
func (s *Room) recordResult(ctx context.Context, w *store.SliceWorkflow, _ *store.SliceStep) (outcome, error) {
	t, res, err := s.finished(ctx, w.ProvisionTaskID)
	if err != nil {
		return outcome{}, err
	}
	if t == nil || res == nil {
		return outcome{kind: fail, signal: signal.SliceProvisionFailed, detail: "slice.vm_provision has no result"}, nil
	}
	var out provisionOutput
	if err := json.Unmarshal(res.Output, &out); err != nil {
		return outcome{kind: fail, signal: signal.SliceProvisionFailed, detail: "slice.vm_provision output does not decode: " + err.Error()}, nil
	}
	var ready struct {
		Ready bool `json:"ready"`
	}
	_ = json.Unmarshal(out.Readiness, &ready)
	vm := api.SliceVM{PrivateIP: out.PrivateIP, SSHHost: out.SSHHost, SSHPort: out.SSHPort, DefaultUser: out.DefaultUser,
		Ready: ready.Ready, Readiness: out.Readiness, Performance: out.Performance, Timings: out.Timings,
		RawVNC: out.RawVNC, ConsoleModel: out.Console}
	raw, _ := json.Marshal(vm)
	if err := s.update(ctx, w, func(w *store.SliceWorkflow) { w.Result = raw }); err != nil {
		return outcome{}, err
	}
	if !vm.Ready {
		return outcome{kind: fail, signal: signal.SliceProvisionFailed, detail: "the VM did not report ready (readiness.ready false)"}, nil
	}
	return outcome{detail: fmt.Sprintf("vm at %s (ssh %s:%d), console %s", vm.PrivateIP, vm.SSHHost, vm.SSHPort, vm.ConsoleModel)}, nil
}

func (s *Room) activate(context.Context, *store.SliceWorkflow, *store.SliceStep) (outcome, error) {
	return outcome{detail: "allocation active"}, nil
}

// enqueueRelease queues slice.vm_release (graceful → destroy, re-bind,
// wipe by the request's policy) when a provision task was queued; with
// none, nothing exists on the node and the step is skipped.
func (s *Room) enqueueRelease(ctx context.Context, w *store.SliceWorkflow, rec *store.SliceStep) (outcome, error) {
	if w.ProvisionTaskID == "" {
		return outcome{kind: skipped, detail: "no slice.vm_provision was queued: nothing to release on the node"}, nil
	}
	if _, err := s.store.GetTask(ctx, w.ProvisionTaskID); errors.Is(err, store.ErrNotFound) {
		return outcome{kind: skipped, detail: "slice.vm_provision " + w.ProvisionTaskID + " was never stored: nothing to release"}, nil
	} else if err != nil {
		return outcome{}, err
	}
	req, err := specOf(*w)
	if err != nil {
		return outcome{}, err
	}
	p, err := planOf(*w)
	if err != nil {
		return outcome{}, err
	}
	wipe := req.WipeOnRelease == nil || *req.WipeOnRelease
	rp := task.VMReleaseParams{VMName: p.VMName, AllocationID: w.AllocationID, Wipe: wipe}
	for _, sl := range p.Slots {
		rp.Slots = append(rp.Slots, task.VMReleaseSlot{SlotID: sl.SlotID, PCIAddress: sl.PCIAddress,
			FabricDevice: sl.FabricDevice, NVMeDevice: sl.NVMeDevice})
	}
	params, _ := json.Marshal(rp)
	id, err := s.enqueue(ctx, w, rec, task.TypeVMRelease, params)
	if err != nil {
		return outcome{}, err
	}
	if w.ReleaseTaskID != id {
		if err := s.update(ctx, w, func(w *store.SliceWorkflow) { w.ReleaseTaskID = id }); err != nil {
			return outcome{}, err
		}
	}
	return outcome{detail: fmt.Sprintf("queued %s (wipe=%v)", id, wipe)}, nil
}

// awaitRelease waits for slice.vm_release. A failed or expired release is
// recorded but does not hold the leases: the node's own slot leases keep a
// VM that is still there from being provisioned over.
func (s *Room) awaitRelease(ctx context.Context, w *store.SliceWorkflow, rec *store.SliceStep) (outcome, error) {
	if w.ReleaseTaskID == "" {
		return outcome{kind: skipped, detail: "no slice.vm_release was queued"}, nil
	}
	if rec.TaskID != w.ReleaseTaskID {
		rec.TaskID = w.ReleaseTaskID
		if err := s.store.UpdateSliceStep(ctx, *rec); err != nil {
			return outcome{}, err
		}
	}
	t, res, err := s.finished(ctx, w.ReleaseTaskID)
	if errors.Is(err, store.ErrNotFound) {
		return outcome{detail: missing(task.TypeVMRelease, w.ReleaseTaskID).detail + "; the node's slot leases guard the slots"}, nil
	}
	if err != nil {
		return outcome{kind: wait}, err
	}
	if t == nil {
		if detail, late := s.overdue(rec, task.TypeVMRelease, w.ReleaseTaskID); late {
			return outcome{detail: detail + "; the node's slot leases guard the slots"}, nil
		}
		return outcome{kind: wait}, nil
	}
	if t.State == api.TaskSucceeded {
		return outcome{detail: t.ID + " succeeded"}, nil
	}
	return outcome{detail: "slice.vm_release did not succeed (" + taskFailure(*t, res) + "); the node's slot leases guard the slots"}, nil
}

// freeLeases frees the allocation's slot leases.
func (s *Room) freeLeases(ctx context.Context, w *store.SliceWorkflow, _ *store.SliceStep) (outcome, error) {
	n, err := s.store.FreeSlotLeases(ctx, w.AllocationID)
	if err != nil {
		return outcome{}, err
	}
	return outcome{detail: fmt.Sprintf("freed %d slot leases", n)}, nil
}
