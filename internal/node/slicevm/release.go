package slicevm

// slice.vm_release: shutdown, undefine, VFIO rebind, file cleanup,
// optional NVMe wipe, lease release, telemetry unregistration.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// ReleaseOutput is slice.vm_release's result.
type ReleaseOutput struct {
	VMName       string `json:"vm_name"`
	AllocationID string `json:"allocation_id,omitempty"`
	// HardStopped: the guest did not shut down within
	// graceful_timeout_seconds and was killed.
	HardStopped bool `json:"hard_stopped"`
	// AlreadyReleased: there was no VM, lease or file left to remove.
	AlreadyReleased bool             `json:"already_released"`
	Slots           []string         `json:"slots"` // slot ids released
	Wiped           []WipedDevice    `json:"wiped"`
	Timings         map[string]int64 `json:"timings"`
	Phases          []PhaseResult    `json:"phases"`
	FailedPhase     string           `json:"failed_phase,omitempty"`
}

// WipedDevice is one zeroed NVMe device.
type WipedDevice struct {
	SlotID     string `json:"slot_id"`
	Device     string `json:"device"`
	Bytes      int64  `json:"bytes"`
	DurationMS int64  `json:"duration_ms"`
}

// Release runs slice.vm_release. Slots come from params and from the
// leases the VM holds (so a release that names no slots frees them all).
// It stops at the first failed phase, so a slot whose device could not be
// rebound or wiped keeps its lease. Releasing a VM that is already gone
// succeeds with AlreadyReleased. A wipe reports progress per device
// ("wipe:<slot_id>").
func (p *Provisioner) Release(ctx context.Context, params task.VMReleaseParams, progress func(phase string, d time.Duration, err error)) (ReleaseOutput, map[string]int64, error) {
	t := newTracker(p.opts.Now, progress)
	out := ReleaseOutput{VMName: params.VMName, AllocationID: params.AllocationID, Slots: []string{},
		Wiped: []WipedDevice{}, Timings: t.timings, Phases: []PhaseResult{}}
	params, err := revalidateRelease(params)
	if err != nil {
		return out, t.timings, err
	}
	unlock := p.lockVM(params.VMName)
	defer unlock()
	r := &release{p: p, params: params, t: t, out: &out}
	err = r.run(ctx)
	out.Phases = t.results
	out.Timings = maps.Clone(t.timings)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			out.FailedPhase = e.Phase
		}
		p.opts.Log.Warn("slicevm: release failed", "vm_name", params.VMName, "err", err)
		return out, t.timings, err
	}
	out.AlreadyReleased = !r.found
	p.opts.Log.Info("slicevm: released", "vm_name", params.VMName, "hard_stopped", out.HardStopped,
		"already_released", out.AlreadyReleased)
	return out, t.timings, nil
}

type release struct {
	p      *Provisioner
	params task.VMReleaseParams
	t      *tracker
	out    *ReleaseOutput
	slots  []task.VMReleaseSlot
	vm     bool // the runtime knows the VM
	found  bool // anything at all was there to release
}

func (r *release) run(ctx context.Context) error {
	p, vm := r.p, r.params.VMName
	leases, err := p.leasesOf(vm)
	if err != nil {
		return &Error{CodedError: api.CodedError{Code: CodeLeaseFailed, Phase: ReleaseShutdown, Message: "read leases: " + err.Error(), Err: err}}
	}
	r.slots = mergeSlots(r.params.Slots, leases)
	refs := releaseRefs(r.params.Slots, r.slots, r.params.Wipe)
	if err := p.checkDevices(ctx, refs); err != nil {
		return err
	}
	fe, err := p.leaseConflicts(vm, refs)
	if err != nil {
		return &Error{CodedError: api.CodedError{Code: CodeLeaseFailed, Phase: PhaseDeviceCheck, Message: "read leases: " + err.Error(), Err: err}}
	}
	if err := deviceErr(CodeLeaseConflict, PhaseDeviceCheck, fe); err != nil {
		return err
	}
	phases := []phase{
		{ReleaseShutdown, r.shutdown},
		{ReleaseUndefine, r.undefine},
		{ReleaseVFIORebind, func(ctx context.Context) (step, error) {
			var addrs []string
			for _, s := range r.slots {
				for _, a := range []string{s.PCIAddress, s.FabricDevice} {
					if a != "" {
						addrs = append(addrs, a)
					}
				}
			}
			return p.bindVFIO(ctx, addrs)
		}},
		{ReleaseRemoveCloudInitDir, r.removeCloudInitDir},
		{ReleaseDropDHCP, r.removeFile(p.dhcpPath(vm))},
	}
	if r.params.Wipe {
		phases = append(phases, phase{ReleaseWipe, r.wipe})
	}
	phases = append(phases, []phase{
		{ReleaseLeases, r.releaseLeases},
		{ReleaseUnregisterTelemetry, r.removeFile(p.telemetryPath(vm))},
	}...)
	for _, ph := range phases {
		if _, err := r.t.run(ctx, ph.name, ph.fn); err != nil {
			return err
		}
	}
	return nil
}

// revalidateRelease runs params through the task contract again.
func revalidateRelease(params task.VMReleaseParams) (task.VMReleaseParams, error) {
	b, err := json.Marshal(params)
	if err != nil {
		return params, &Error{CodedError: api.CodedError{Code: "invalid_params", Phase: "params", Message: err.Error(), Err: err}}
	}
	got, fe := task.DecodeVMReleaseParams(b)
	if fe != nil {
		return params, &Error{CodedError: api.CodedError{Code: "invalid_params", Phase: "params", Message: fieldErrs(fe)}}
	}
	return got, nil
}

// mergeSlots is params' slots, with fields they leave out filled from the
// VM's leases, plus any leased slot params do not name.
func mergeSlots(given []task.VMReleaseSlot, leases []Lease) []task.VMReleaseSlot {
	byID := map[string]Lease{}
	for _, l := range leases {
		byID[l.SlotID] = l
	}
	out := make([]task.VMReleaseSlot, 0, len(given)+len(leases))
	named := map[string]bool{}
	for _, s := range given {
		named[s.SlotID] = true
		if l, ok := byID[s.SlotID]; ok {
			s.PCIAddress = first(s.PCIAddress, l.PCIAddress)
			s.FabricDevice = first(s.FabricDevice, l.FabricDevice)
			s.NVMeDevice = first(s.NVMeDevice, l.NVMeDevice)
		}
		out = append(out, s)
	}
	for _, l := range leases {
		if !named[l.SlotID] {
			out = append(out, task.VMReleaseSlot{SlotID: l.SlotID, PCIAddress: l.PCIAddress,
				FabricDevice: l.FabricDevice, NVMeDevice: l.NVMeDevice})
		}
	}
	return out
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (r *release) shutdown(ctx context.Context) (step, error) {
	rt, vm := r.p.opts.Runtime, r.params.VMName
	st, err := rt.Inspect(ctx, vm)
	switch {
	case errors.Is(err, runtime.ErrNotFound):
		return skipped("no vm %s in the %s runtime", vm, rt.Name()), nil
	case err != nil:
		return step{}, failf(CodeVMStopFailed, "inspect %s: %w", vm, err)
	case st.Owner != Owner:
		return step{}, failf(CodeVMNameInUse, "%s is an instance owned by %q, not a slice VM", vm, st.Owner)
	}
	r.vm, r.found = true, true
	graceful := time.Duration(r.params.GracefulTimeoutSeconds) * time.Second
	res, err := rt.Stop(ctx, vm, graceful)
	if err != nil {
		return step{}, failf(CodeVMStopFailed, "stop %s: %w", vm, err)
	}
	r.out.HardStopped = res.HardStopped
	if res.HardStopped {
		return done("%s ignored the shutdown request for %s and was killed (hard_stopped)", vm, graceful), nil
	}
	if st.State != runtime.StateRunning {
		return done("%s was already %s", vm, st.State), nil
	}
	return done("%s shut down in %s", vm, res.Took.Round(time.Millisecond)), nil
}

func (r *release) undefine(ctx context.Context) (step, error) {
	if !r.vm {
		return skipped("no vm"), nil
	}
	if err := r.p.opts.Runtime.Destroy(ctx, r.params.VMName); err != nil {
		return step{}, failf(CodeVMDestroyFailed, "destroy %s: %w", r.params.VMName, err)
	}
	return done("destroyed %s and its runtime state", r.params.VMName), nil
}

func (r *release) removeCloudInitDir(context.Context) (step, error) {
	vm := r.params.VMName
	dir := filepath.Join(r.p.opts.CloudInitDir, vm)
	var did []string
	if exists(dir) {
		if err := os.RemoveAll(dir); err != nil {
			return step{}, err
		}
		did = append(did, "removed "+dir)
	}
	key, err := r.p.removeKeyPair(vm)
	if err != nil {
		return step{}, err
	}
	if key {
		did = append(did, "removed terminal key "+r.p.keyPath(vm))
	}
	if rec, err := r.p.removeTerminal(vm); err != nil {
		return step{}, err
	} else if rec {
		did = append(did, "removed terminal record "+r.p.terminalPath(vm))
	}
	if len(did) == 0 {
		return skipped("nothing to remove"), nil
	}
	r.found = true
	return done("%s", strings.Join(did, "; ")), nil
}

func (r *release) removeFile(path string) func(context.Context) (step, error) {
	return func(context.Context) (step, error) {
		ok, err := removeFile(path)
		if err != nil {
			return step{}, err
		}
		if !ok {
			return skipped("no %s", path), nil
		}
		r.found = true
		return done("removed %s", path), nil
	}
}

func (r *release) wipe(ctx context.Context) (step, error) {
	var wiped []string
	for _, s := range r.slots {
		if s.NVMeDevice == "" {
			continue
		}
		start := r.p.opts.Now()
		n, err := r.wipeOne(ctx, s.NVMeDevice)
		d := r.p.opts.Now().Sub(start)
		if r.t.progress != nil {
			r.t.progress(ReleaseWipe+":"+s.SlotID, d, err)
		}
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				return step{}, e
			}
			return step{}, failf(CodeWipeFailed, "zero %s (slot %s) after %d bytes: %w", s.NVMeDevice, s.SlotID, n, err)
		}
		r.out.Wiped = append(r.out.Wiped, WipedDevice{SlotID: s.SlotID, Device: s.NVMeDevice, Bytes: n, DurationMS: d.Milliseconds()})
		wiped = append(wiped, fmt.Sprintf("%s (%d bytes)", s.NVMeDevice, n))
	}
	if len(wiped) == 0 {
		return skipped("no nvme devices"), nil
	}
	return done("zeroed %s", strings.Join(wiped, ", ")), nil
}

// wipeOne checks the device as a provision does (allowed, not mounted or
// held) and zeroes it.
func (r *release) wipeOne(ctx context.Context, dev string) (int64, error) {
	resolved, err := r.p.checkDevice(dev)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Code = CodeWipeFailed
		}
		return 0, err
	}
	return zeroDevice(ctx, resolved)
}

func (r *release) releaseLeases(context.Context) (step, error) {
	for _, s := range r.slots {
		ok, err := r.p.releaseLease(r.params.VMName, s.SlotID)
		if err != nil {
			return step{}, failf(CodeLeaseFailed, "release lease of slot %s: %w", s.SlotID, err)
		}
		if ok {
			r.out.Slots = append(r.out.Slots, s.SlotID)
		}
	}
	if len(r.out.Slots) == 0 {
		return skipped("no lease held by %s", r.params.VMName), nil
	}
	r.found = true
	return done("released %s", strings.Join(r.out.Slots, ", ")), nil
}
