package diag

// Readers for procfs, sysfs and devfs below the configured roots. They are
// plain file reads, so they compile everywhere; Probe only uses them when the
// host is Linux.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/node/hostinfo"
)

// PCI vendor ids the probe knows (internal/node/hostinfo classifies them).
const (
	VendorNVIDIA   = hostinfo.VendorNVIDIA
	VendorAMD      = hostinfo.VendorAMD
	VendorIntel    = hostinfo.VendorIntel
	VendorMellanox = hostinfo.VendorMellanox
)

// vfioModuleNames are the modules the vfio check looks for.
func vfioModuleNames() []string { return []string{"vfio", "vfio_pci", "vfio_iommu_type1"} }

func (p *Prober) kernelPhase(ctx context.Context, _ Params) (Check, func(*Report)) {
	var (
		v   string
		err error
	)
	if p.cfg.GOOS == "linux" {
		v, err = readTrim(filepath.Join(p.cfg.ProcRoot, "sys", "kernel", "osrelease"))
	} else {
		v, err = hostKernelVersion(ctx)
	}
	if err == nil && v == "" {
		err = errors.New("empty kernel version")
	}
	if err != nil {
		return Check{Reason: ReasonKernelUnavailable, Detail: err.Error()}, nil
	}
	return Check{OK: true, Detail: v}, func(r *Report) { r.KernelVersion = v }
}

func (p *Prober) memoryPhase(ctx context.Context, _ Params) (Check, func(*Report)) {
	var (
		m   memInfo
		err error
	)
	if p.cfg.GOOS == "linux" {
		var mi hostinfo.Meminfo
		mi, err = hostinfo.ReadMeminfo(filepath.Join(p.cfg.ProcRoot, "meminfo"))
		m = fromMeminfo(mi)
	} else {
		m, err = hostMemory(ctx)
	}
	if err == nil && m.total == 0 {
		err = errors.New("total memory reported as 0")
	}
	if err != nil {
		return Check{Reason: ReasonMemoryUnavailable, Detail: err.Error()}, nil
	}
	return Check{OK: true}, func(r *Report) {
		r.MemTotalMB = int(m.total >> 20)
		r.MemFreeMB = int(m.free >> 20)
		r.MemAvailableMB = int(m.available >> 20)
	}
}

func (p *Prober) kvmPhase(_ context.Context, _ Params) (Check, func(*Report)) {
	if p.cfg.GOOS != "linux" {
		return notApplicable(p.cfg.GOOS), nil
	}
	st := KVMStatus{Path: filepath.Join(p.cfg.DevRoot, "kvm")}
	apply := func(r *Report) { r.KVM = st }
	c := p.kvmCheck(&st)
	if !c.OK && p.cfg.OtherAccel != "" {
		// The host is configured to run its VMs with another
		// accelerator: KVM's state is reported, not held against it.
		return Check{OK: true, Reason: ReasonNotApplicable,
			Detail: "VMs run with " + p.cfg.OtherAccel + " (kvm: " + c.Reason + ")"}, apply
	}
	return c, apply
}

// kvmCheck fills st and returns the verdict on KVM.
func (p *Prober) kvmCheck(st *KVMStatus) Check {
	if _, err := os.Stat(st.Path); err != nil {
		st.Error = err.Error()
		return Check{Reason: ReasonKVMMissing, Detail: st.Error}
	}
	st.Present = true
	f, err := os.OpenFile(st.Path, os.O_RDWR, 0)
	if err != nil {
		st.Error = err.Error()
		return Check{Reason: ReasonKVMNotOpenable, Detail: st.Error}
	}
	_ = f.Close() // opened read-write only to prove access; nothing written
	st.Openable = true
	if p.cfg.KVMVerdict != nil {
		// An openable /dev/kvm is not a working KVM: the accelerator
		// probe's verdict (a guest really ran, fast enough) decides.
		if v, ok := p.cfg.KVMVerdict(); ok && !v.Works {
			st.Error = "accelerator probe: " + v.Reason
			if v.Detail != "" {
				st.Error += ": " + v.Detail
			}
			return Check{Reason: v.Reason, Detail: st.Error}
		}
	}
	return Check{OK: true}
}

func (p *Prober) vfioPhase(ctx context.Context, _ Params) (Check, func(*Report)) {
	if p.cfg.GOOS != "linux" {
		return notApplicable(p.cfg.GOOS), nil
	}
	mods, err := vfioModules(p.cfg.ProcRoot, p.cfg.SysRoot)
	apply := func(r *Report) { r.VFIO.Modules = mods }
	var fail Check
	if err != nil {
		fail = Check{Reason: ReasonVFIOModulesMissing, Detail: err.Error()}
	} else {
		var missing []string
		for _, name := range vfioModuleNames() {
			if !mods[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return Check{OK: true}, apply
		}
		fail = Check{Reason: ReasonVFIOModulesMissing, Detail: "not loaded: " + strings.Join(missing, ", ")}
	}
	// VFIO is what passes GPUs through to slice VMs: on a host with no
	// GPU it has nothing to do, and its absence is not ill health.
	if n, scanErr := p.gpuCount(ctx); scanErr == nil && n == 0 {
		return Check{OK: true, Reason: ReasonNotApplicable, Detail: "no GPU to pass through (" + fail.Detail + ")"}, apply
	}
	return fail, apply
}

// gpuCount is the number of GPUs on the PCI bus.
func (p *Prober) gpuCount(ctx context.Context) (int, error) {
	funcs, err := scanPCI(ctx, p.cfg.SysRoot)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range funcs {
		if isGPU(f.vendor, f.class) {
			n++
		}
	}
	return n, nil
}

// vfioModules reports each VFIO module as loaded or built in.
func vfioModules(procRoot, sysRoot string) (map[string]bool, error) {
	return hostinfo.LoadedModules(procRoot, sysRoot, vfioModuleNames())
}

// pciFunc is one parsed entry of <sys>/bus/pci/devices.
type pciFunc struct {
	PCIDevice
	vendor, class uint32
	dir           string
}

// scanPCI lists PCI functions sorted by address (hostinfo.ScanPCI).
func scanPCI(ctx context.Context, sysRoot string) ([]pciFunc, error) {
	devs, err := hostinfo.ScanPCI(ctx, sysRoot)
	out := make([]pciFunc, 0, len(devs))
	for _, d := range devs {
		out = append(out, pciFunc{
			PCIDevice: PCIDevice{
				Address:    d.Address,
				Vendor:     fmt.Sprintf("0x%04x", d.Vendor),
				VendorName: hostinfo.VendorShortName(d.Vendor),
				Device:     fmt.Sprintf("0x%04x", d.Device),
				Class:      fmt.Sprintf("0x%06x", d.Class),
				NUMANode:   d.NUMANode,
				Driver:     d.Driver,
			},
			vendor: d.Vendor, class: d.Class, dir: d.Dir,
		})
	}
	return out, err
}

func isGPU(vendor, class uint32) bool    { return hostinfo.IsGPU(vendor, class) }
func isFabric(vendor, class uint32) bool { return hostinfo.IsFabric(vendor, class) }

func (p *Prober) gpuPhase(ctx context.Context, _ Params) (Check, func(*Report)) {
	if p.cfg.GOOS != "linux" {
		return notApplicable(p.cfg.GOOS), nil
	}
	funcs, err := scanPCI(ctx, p.cfg.SysRoot)
	if err != nil {
		return Check{Reason: ReasonPCIScanFailed, Detail: err.Error()}, nil
	}
	gpus := []PCIDevice{}
	for _, f := range funcs {
		if isGPU(f.vendor, f.class) {
			gpus = append(gpus, f.PCIDevice)
		}
	}
	return Check{OK: true, Detail: fmt.Sprintf("%d GPU(s)", len(gpus))}, func(r *Report) {
		r.GPUs = GPUStatus{Count: len(gpus), Devices: gpus}
	}
}

func (p *Prober) fabricPhase(ctx context.Context, _ Params) (Check, func(*Report)) {
	if p.cfg.GOOS != "linux" {
		return notApplicable(p.cfg.GOOS), nil
	}
	funcs, err := scanPCI(ctx, p.cfg.SysRoot)
	if err != nil {
		return Check{Reason: ReasonPCIScanFailed, Detail: err.Error()}, nil
	}
	links := []FabricLink{}
	var down []string
	for _, f := range funcs {
		if !isFabric(f.vendor, f.class) {
			continue
		}
		base := FabricLink{PCIAddress: f.Address, Device: f.Device, NUMANode: f.NUMANode, Driver: f.Driver}
		ifaces := netInterfaces(f.dir)
		if len(ifaces) == 0 {
			links = append(links, base)
			continue
		}
		for _, l := range ifaces {
			l.PCIAddress, l.Device, l.NUMANode, l.Driver = base.PCIAddress, base.Device, base.NUMANode, base.Driver
			if !l.Up {
				down = append(down, l.Interface)
			}
			links = append(links, l)
		}
	}
	apply := func(r *Report) { r.Fabric = links }
	if len(down) > 0 {
		return Check{Reason: ReasonFabricLinkDown, Detail: "down: " + strings.Join(down, ", ")}, apply
	}
	return Check{OK: true, Detail: fmt.Sprintf("%d fabric link(s)", len(links))}, apply
}

// netInterfaces reads <pcidir>/net/<if>/{operstate,speed}. The speed file
// fails to read (EINVAL) or holds -1 on a down link; both give 0.
func netInterfaces(pciDir string) []FabricLink {
	ents, err := os.ReadDir(filepath.Join(pciDir, "net"))
	if err != nil {
		return nil
	}
	var out []FabricLink
	for _, e := range ents {
		dir := filepath.Join(pciDir, "net", e.Name())
		l := FabricLink{Interface: e.Name()}
		l.OperState, _ = readTrim(filepath.Join(dir, "operstate"))
		if s, err := readTrim(filepath.Join(dir, "speed")); err == nil {
			if n, err := strconv.Atoi(s); err == nil && n > 0 {
				l.SpeedMbps = n
			}
		}
		l.Up = l.OperState == "up"
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Interface < out[j].Interface })
	return out
}

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}
