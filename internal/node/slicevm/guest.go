package slicevm

// Work inside a ready guest over the brokered SSH channel
// (internal/node/guestssh, with the VM's terminal record): the
// allocation's user, telemetry and the performance probe.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/drover-dev/drover/internal/node/guestssh"
)

// Bounds of the work done in a guest.
const (
	// TelemetryTimeout bounds one telemetry collection in one guest.
	TelemetryTimeout = 30 * time.Second
	// ProbeTimeout bounds the performance probe.
	ProbeTimeout = 2 * time.Minute
)

// GuestTarget is vm's SSH target for allocationID from its terminal
// record (errors as Terminal's).
func (p *Provisioner) GuestTarget(vm, allocationID string) (guestssh.Target, error) {
	t, err := p.Terminal(vm, allocationID)
	if err != nil {
		return guestssh.Target{}, err
	}
	sliceNet, own := p.guestNet(vm)
	return guestssh.Target{Addr: t.Addr(), User: t.User, KeyPath: t.KeyPath, HostKeys: t.HostKeys,
		SliceNet: sliceNet, VMAddr: own}, nil
}

// GuestUserOutput is allocation.provision_user's (and deprovision_user's)
// result when it ran inside a slice VM.
type GuestUserOutput struct {
	VMName       string `json:"vm_name"`
	AllocationID string `json:"allocation_id"`
	// Target is "guest": the user lives in the VM, not on the host.
	Target string `json:"target"`
	// Via is how the agent became root in the guest: "root",
	// "sudo:<user>" or "<user>" (uid 0).
	Via     string               `json:"via"`
	User    *guestssh.UserResult `json:"user,omitempty"`
	Removed *bool                `json:"removed,omitempty"`
}

// ProvisionGuestUser creates (or updates) the allocation's user inside
// vm, which must be a VM this node provisioned for allocationID (its
// terminal record says so). Idempotent; on failure the guest is rolled
// back (guestssh.ProvisionUser). Calls on one VM are serialised with its
// provision and release.
func (p *Provisioner) ProvisionGuestUser(ctx context.Context, vm string, req guestssh.UserRequest) (GuestUserOutput, error) {
	out := GuestUserOutput{VMName: vm, AllocationID: req.AllocationID, Target: "guest"}
	unlock := p.lockVM(vm)
	defer unlock()
	c, err := p.openAdmin(ctx, vm, req.AllocationID)
	if err != nil {
		return out, err
	}
	defer func() { _ = c.Close() }()
	out.Via = c.Via
	u, err := guestssh.ProvisionUser(ctx, c, req)
	if err != nil {
		return out, err
	}
	out.User = &u
	p.opts.Log.Info("slicevm: guest user provisioned", "vm_name", vm, "username", u.Username, "created", u.Created, "via", c.Via)
	return out, nil
}

// DeprovisionGuestUser removes the allocation's access from username
// inside vm (guestssh.DeprovisionUser). A VM without a terminal record
// (released, never provisioned here) has nothing left to remove: the
// output says so and no error is returned.
func (p *Provisioner) DeprovisionGuestUser(ctx context.Context, vm, allocationID, username string, removeHome bool) (GuestUserOutput, error) {
	out := GuestUserOutput{VMName: vm, AllocationID: allocationID, Target: "guest"}
	unlock := p.lockVM(vm)
	defer unlock()
	c, err := p.openAdmin(ctx, vm, allocationID)
	if errors.Is(err, ErrNoTerminal) {
		f := false
		out.Removed = &f
		return out, nil
	}
	if err != nil {
		return out, err
	}
	defer func() { _ = c.Close() }()
	out.Via = c.Via
	removed, err := guestssh.DeprovisionUser(ctx, c, allocationID, username, removeHome)
	out.Removed = &removed
	return out, err
}

func (p *Provisioner) openAdmin(ctx context.Context, vm, allocationID string) (*guestssh.Conn, error) {
	t, err := p.GuestTarget(vm, allocationID)
	if err != nil {
		return nil, err
	}
	return guestssh.OpenAdmin(ctx, t)
}

// collectGuest collects vm's telemetry over its terminal record's SSH
// target, bounded by TelemetryTimeout.
func (p *Provisioner) collectGuest(ctx context.Context, vm, allocationID string) guestssh.Telemetry {
	ctx, cancel := context.WithTimeout(ctx, TelemetryTimeout)
	defer cancel()
	t, err := p.GuestTarget(vm, allocationID)
	if err != nil {
		return guestssh.Telemetry{CollectedAt: p.opts.Now().UTC(), Error: err.Error()}
	}
	c, err := guestssh.Open(ctx, t)
	if err != nil {
		return guestssh.Telemetry{CollectedAt: p.opts.Now().UTC(), Error: err.Error()}
	}
	defer func() { _ = c.Close() }()
	tel, _ := guestssh.Collect(ctx, c, p.opts.Now().UTC())
	return tel
}

// storeTelemetry writes tel into vm's guest registration (if it is still
// registered).
func (p *Provisioner) storeTelemetry(vm string, tel guestssh.Telemetry) error {
	path := p.telemetryPath(vm)
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var g Guest
	if err := json.Unmarshal(b, &g); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	g.Telemetry = &tel
	b, err = json.MarshalIndent(g, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(path, append(b, '\n'), 0o644)
}

// CollectTelemetry collects every registered guest's telemetry over the
// brokered SSH channel (each bounded by TelemetryTimeout), stores it in
// the guest's registration and returns the guests. A guest that cannot
// be reached gets Telemetry.Ready false with the error; a guest whose VM
// is being provisioned or released is left as it was.
func (p *Provisioner) CollectTelemetry(ctx context.Context) ([]Guest, error) {
	guests, err := p.Guests(ctx)
	if err != nil {
		return nil, err
	}
	for i, g := range guests {
		if err := ctx.Err(); err != nil {
			return guests, err
		}
		unlock, ok := p.tryLockVM(g.VMName)
		if !ok {
			continue
		}
		if _, terr := p.Terminal(g.VMName, g.AllocationID); errors.Is(terr, ErrNoTerminal) {
			unlock()
			continue // not ready yet, or no ssh forward: nothing to collect over
		}
		tel := p.collectGuest(ctx, g.VMName, g.AllocationID)
		if err := p.storeTelemetry(g.VMName, tel); err != nil && !errors.Is(err, os.ErrNotExist) {
			p.opts.Log.Warn("slicevm: store guest telemetry", "vm_name", g.VMName, "err", err)
		}
		unlock()
		guests[i].Telemetry = &tel
	}
	return guests, nil
}

// tryLockVM is lockVM without waiting: ok is false when the VM is busy.
func (p *Provisioner) tryLockVM(name string) (func(), bool) {
	p.mu.Lock()
	if l := p.locks[name]; l != nil {
		p.mu.Unlock()
		return nil, false
	}
	p.mu.Unlock()
	return p.lockVM(name), true
}

// firstTelemetry collects the guest's telemetry right after readiness,
// stores it and reports it in the output.
func (pr *provision) firstTelemetry(ctx context.Context) string {
	tel := pr.p.collectGuest(ctx, pr.params.VMName, pr.params.AllocationID)
	pr.out.Telemetry = &tel
	if err := pr.p.storeTelemetry(pr.params.VMName, tel); err != nil {
		pr.p.opts.Log.Warn("slicevm: store guest telemetry", "vm_name", pr.params.VMName, "err", err)
	}
	if !tel.Ready {
		return "guest telemetry not ready: " + tel.Error
	}
	return fmt.Sprintf("guest telemetry ready (%d cpus, %d MiB available, %d gpus)",
		tel.CPUs, tel.MemoryAvailableBytes>>20, tel.GPUs)
}

// guestProbe runs the performance probe in the guest, bounded by
// ProbeTimeout. Its failure is reported, not fatal: the VM is ready.
func (pr *provision) guestProbe(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	t, err := pr.p.GuestTarget(pr.params.VMName, pr.params.AllocationID)
	if err != nil {
		pr.out.Performance.GuestProbeError = err.Error()
		return "no guest probe: " + err.Error()
	}
	c, err := guestssh.Open(ctx, t)
	if err == nil {
		defer func() { _ = c.Close() }()
		var g guestssh.Probe
		if g, err = guestssh.RunProbe(ctx, c, guestssh.ProbeLimits{}); err == nil {
			pr.out.Performance.Guest = &g
			return fmt.Sprintf("guest: cpu %d iterations in %dms, memory %.1f MiB/s, disk write %.1f MiB/s, %d gpus visible",
				g.CPULoopIterations, g.CPULoopMS, g.MemoryMiBPerS, g.DiskWriteMiBPerS, g.GPUsVisible)
		}
	}
	pr.out.Performance.GuestProbeError = err.Error()
	pr.p.opts.Log.Warn("slicevm: guest performance probe failed", "vm_name", pr.params.VMName, "err", err)
	return "guest probe failed: " + err.Error()
}
