package slicevm

// The device rule: which GPUs, fabric VFs and NVMe namespaces a task may
// bind, rebind, write or wipe (see the package comment).

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/drover-dev/drover/internal/node/slice"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// PhaseDeviceCheck is where a task naming a device outside the rule is
// refused: before the first phase, so nothing has been touched.
const PhaseDeviceCheck = "device_check"

// ErrDeviceNotAllowed is the cause (errors.Is) of a refusal by the device
// rule; Error.Fields name each refused param.
var ErrDeviceNotAllowed = errors.New("device not allowed")

// deviceKind is the role a task gives a device.
type deviceKind int

const (
	kindGPU deviceKind = iota
	kindFabric
	kindNVMe
)

func (k deviceKind) String() string {
	switch k {
	case kindGPU:
		return "GPU"
	case kindFabric:
		return "fabric VF"
	default:
		return "NVMe namespace"
	}
}

// deviceRef is one device a task would touch and the field naming it
// ("params.slots[0].pci_address", or "leases[slot-0].pci_address" for a
// device taken from the VM's lease).
type deviceRef struct {
	field string
	kind  deviceKind
	value string
}

// provisionRefs are every device slice.vm_provision binds, writes or
// leases (so that a later release may wipe it).
func provisionRefs(slots []task.VMSlot) []deviceRef {
	var out []deviceRef
	for i, s := range slots {
		f := func(name string) string { return fmt.Sprintf("params.slots[%d].%s", i, name) }
		out = append(out, deviceRef{f("pci_address"), kindGPU, s.PCIAddress})
		if s.FabricDevice != "" {
			out = append(out, deviceRef{f("fabric_device"), kindFabric, s.FabricDevice})
		}
		if s.NVMeDevice != "" {
			out = append(out, deviceRef{f("nvme_device"), kindNVMe, s.NVMeDevice})
		}
	}
	return out
}

// releaseRefs are the devices slice.vm_release rebinds (and, with wipe,
// zeroes). merged is mergeSlots(given, leases): a value params gave is
// named by its params field, one filled in from a lease by the lease.
func releaseRefs(given, merged []task.VMReleaseSlot, wipe bool) []deviceRef {
	var out []deviceRef
	for i, s := range merged {
		var g task.VMReleaseSlot
		if i < len(given) {
			g = given[i]
		}
		add := func(name string, kind deviceKind, val, fromParams string) {
			if val == "" {
				return
			}
			field := fmt.Sprintf("leases[%s].%s", s.SlotID, name)
			if fromParams != "" {
				field = fmt.Sprintf("params.slots[%d].%s", i, name)
			}
			out = append(out, deviceRef{field, kind, val})
		}
		add("pci_address", kindGPU, s.PCIAddress, g.PCIAddress)
		add("fabric_device", kindFabric, s.FabricDevice, g.FabricDevice)
		if wipe {
			add("nvme_device", kindNVMe, s.NVMeDevice, g.NVMeDevice)
		}
	}
	return out
}

// slotDevices are the devices of the candidate slots of one discovery.
type slotDevices struct {
	gpus, fabrics map[string]bool
	nvme          map[string]bool   // resolved path of each slot's namespace
	nvmeInUse     map[string]string // resolved path of a namespace kept out of slots → why
}

// slotDevices runs the configured discovery and indexes its candidate slots.
// Topology paths are the host's ("/dev/..."); they are read below
// SysfsRoot.
func (p *Provisioner) slotDevices(ctx context.Context) (slotDevices, error) {
	topo, err := p.opts.Topology(ctx)
	if err != nil {
		return slotDevices{}, err
	}
	d := slotDevices{gpus: map[string]bool{}, fabrics: map[string]bool{}, nvme: map[string]bool{},
		nvmeInUse: map[string]string{}}
	for _, c := range topo.CandidateSlots {
		d.gpus[c.PCIAddress] = true
		if c.FabricDevice != nil {
			d.fabrics[*c.FabricDevice] = true
		}
		if c.NVMeDevice != nil {
			d.nvme[resolvePath(p.root(*c.NVMeDevice))] = true
		}
	}
	for _, n := range topo.NVMeDevices {
		if r := resolvePath(p.root(n.Path)); n.InUse && !d.nvme[r] {
			var why []string
			for _, m := range n.MountPoints {
				why = append(why, "mounted at "+m)
			}
			for _, h := range n.Holders {
				why = append(why, "held by "+h)
			}
			if len(why) == 0 {
				why = []string{"mount state unknown"}
			}
			d.nvmeInUse[r] = n.Name + " is in use: " + strings.Join(why, ", ")
		}
	}
	return d, nil
}

// checkDevices applies the device rule to refs: each must be, in its
// role, a device of a candidate slot of this host's topology as
// discovered now. It returns nil for no refs without discovering.
func (p *Provisioner) checkDevices(ctx context.Context, refs []deviceRef) error {
	if len(refs) == 0 {
		return nil
	}
	allowed, err := p.slotDevices(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return &Error{CodedError: api.CodedError{Code: CodeCanceled, Phase: PhaseDeviceCheck, Message: err.Error(), Err: err}}
		}
		return &Error{CodedError: api.CodedError{Code: CodeTopologyFailed, Phase: PhaseDeviceCheck,
			Message: "discover this host's slots to check the task's devices: " + err.Error(), Err: err}}
	}
	var fe []api.FieldError
	for _, r := range refs {
		if msg := allowed.check(r); msg != "" {
			fe = append(fe, api.FieldError{Field: r.field, Message: msg})
		}
	}
	return deviceErr(CodeDeviceNotAllowed, PhaseDeviceCheck, fe)
}

// check returns why r is refused ("" when it is allowed).
func (d slotDevices) check(r deviceRef) string {
	notSlot := fmt.Sprintf("%s is not a device of an approved slot on this host", r.value)
	switch r.kind {
	case kindGPU:
		if !d.gpus[r.value] {
			return notSlot + " (not the GPU of any slot in this host's slice topology)"
		}
	case kindFabric:
		if !d.fabrics[r.value] {
			return notSlot + " (not the fabric VF of any slot in this host's slice topology)"
		}
	case kindNVMe:
		if !filepath.IsAbs(r.value) || filepath.Clean(r.value) != r.value {
			return fmt.Sprintf("%s is not a clean absolute path", r.value)
		}
		resolved, err := filepath.EvalSymlinks(r.value)
		if err != nil {
			return fmt.Sprintf("%s (cannot resolve it: %v)", notSlot, err)
		}
		if why, ok := d.nvmeInUse[resolved]; ok {
			return fmt.Sprintf("%s (%s)", notSlot, why)
		}
		if !d.nvme[resolved] {
			return fmt.Sprintf("%s (%s is not the NVMe namespace of any slot in this host's slice topology)", notSlot, resolved)
		}
	}
	return ""
}

// leaseConflicts names each ref whose device another VM's lease holds (a
// slot id is leased once, but two slot ids may name one device).
func (p *Provisioner) leaseConflicts(vm string, refs []deviceRef) ([]api.FieldError, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	leases, err := p.allLeases()
	if err != nil {
		return nil, err
	}
	held := map[string]Lease{} // kind key → lease
	for _, l := range leases {
		if l.VMName == vm {
			continue
		}
		for _, ref := range []deviceRef{{kind: kindGPU, value: l.PCIAddress}, {kind: kindFabric, value: l.FabricDevice},
			{kind: kindNVMe, value: l.NVMeDevice}} {
			if ref.value != "" {
				held[deviceKey(ref)] = l
			}
		}
	}
	var fe []api.FieldError
	for _, r := range refs {
		if l, ok := held[deviceKey(r)]; ok {
			fe = append(fe, api.FieldError{Field: r.field,
				Message: fmt.Sprintf("%s is leased to vm %s (slot %s, allocation %s)", r.value, l.VMName, l.SlotID, l.AllocationID)})
		}
	}
	return fe, nil
}

// deviceKey identifies a device: PCI functions by address (a GPU and a
// VF share the key space), NVMe namespaces by resolved path.
func deviceKey(r deviceRef) string {
	if r.kind == kindNVMe {
		return "nvme:" + resolvePath(r.value)
	}
	return "pci:" + r.value
}

// resolvePath follows path's symlinks; a path that does not resolve stays
// as it is (cleaned).
func resolvePath(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return filepath.Clean(path)
}

// deviceErr is the refusal naming fe's fields, in params order (nil for
// none).
func deviceErr(code, phase string, fe []api.FieldError) error {
	if len(fe) == 0 {
		return nil
	}
	return &Error{CodedError: api.CodedError{Code: code, Phase: phase, Message: fieldErrs(fe), Fields: fe, Err: ErrDeviceNotAllowed}}
}

// defaultTopology discovers the slots below SysfsRoot with
// slice.topology_discover's default params.
func defaultTopology(opts Options) func(context.Context) (slice.Topology, error) {
	d := slice.NewDiscoverer(slice.Config{SysRoot: filepath.Join(opts.SysfsRoot, "sys"),
		ProcRoot: filepath.Join(opts.SysfsRoot, "proc"), DevRoot: filepath.Join(opts.SysfsRoot, "dev"),
		RootDir: opts.SysfsRoot, LookPath: opts.LookPath})
	return func(ctx context.Context) (slice.Topology, error) {
		topo, _, err := d.Discover(ctx, slice.Params{}, nil)
		if err != nil {
			return slice.Topology{}, fmt.Errorf("slice topology: %w", err)
		}
		return topo, nil
	}
}
