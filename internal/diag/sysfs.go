package diag

// Readers for procfs, sysfs and devfs below the configured roots. They are
// plain file reads, so they compile everywhere; Probe only uses them when the
// host is Linux.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// PCI vendor ids the probe knows.
const (
	VendorNVIDIA   = 0x10de
	VendorAMD      = 0x1002
	VendorIntel    = 0x8086
	VendorMellanox = 0x15b3
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

type memInfo struct{ total, free, available uint64 } // bytes

func (p *Prober) memoryPhase(ctx context.Context, _ Params) (Check, func(*Report)) {
	var (
		m   memInfo
		err error
	)
	if p.cfg.GOOS == "linux" {
		m, err = readMeminfo(filepath.Join(p.cfg.ProcRoot, "meminfo"))
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

// readMeminfo parses /proc/meminfo. MemAvailable (Linux >= 3.14) falls back
// to MemFree+Buffers+Cached on older kernels.
func readMeminfo(path string) (memInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return memInfo{}, fmt.Errorf("read meminfo: %w", err)
	}
	kv := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && strings.EqualFold(f[1], "kB") {
			n <<= 10
		}
		kv[key] = n
	}
	m := memInfo{total: kv["MemTotal"], free: kv["MemFree"]}
	if v, ok := kv["MemAvailable"]; ok {
		m.available = v
	} else {
		m.available = kv["MemFree"] + kv["Buffers"] + kv["Cached"]
	}
	if _, ok := kv["MemTotal"]; !ok {
		return memInfo{}, fmt.Errorf("meminfo %s: no MemTotal line", path)
	}
	return m, nil
}

func (p *Prober) kvmPhase(_ context.Context, _ Params) (Check, func(*Report)) {
	if p.cfg.GOOS != "linux" {
		return notApplicable(p.cfg.GOOS), nil
	}
	st := KVMStatus{Path: filepath.Join(p.cfg.DevRoot, "kvm")}
	apply := func(r *Report) { r.KVM = st }
	if _, err := os.Stat(st.Path); err != nil {
		st.Error = err.Error()
		return Check{Reason: ReasonKVMMissing, Detail: st.Error}, apply
	}
	st.Present = true
	f, err := os.OpenFile(st.Path, os.O_RDWR, 0)
	if err != nil {
		st.Error = err.Error()
		return Check{Reason: ReasonKVMNotOpenable, Detail: st.Error}, apply
	}
	_ = f.Close() // opened read-write only to prove access; nothing written
	st.Openable = true
	return Check{OK: true}, apply
}

func (p *Prober) vfioPhase(_ context.Context, _ Params) (Check, func(*Report)) {
	if p.cfg.GOOS != "linux" {
		return notApplicable(p.cfg.GOOS), nil
	}
	mods, err := vfioModules(p.cfg.ProcRoot, p.cfg.SysRoot)
	apply := func(r *Report) { r.VFIO.Modules = mods }
	if err != nil {
		return Check{Reason: ReasonVFIOModulesMissing, Detail: err.Error()}, apply
	}
	var missing []string
	for _, name := range vfioModuleNames() {
		if !mods[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return Check{Reason: ReasonVFIOModulesMissing, Detail: "not loaded: " + strings.Join(missing, ", ")}, apply
	}
	return Check{OK: true}, apply
}

// vfioModules reports each VFIO module as loaded when <proc>/modules lists
// it or <sys>/module/<name> exists (built-in modules only show there). A
// missing /proc/modules (kernel without module support) is not an error.
func vfioModules(procRoot, sysRoot string) (map[string]bool, error) {
	mods := make(map[string]bool, 3)
	loaded := map[string]bool{}
	b, err := os.ReadFile(filepath.Join(procRoot, "modules"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return mods, fmt.Errorf("read modules: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			loaded[f[0]] = true
		}
	}
	for _, name := range vfioModuleNames() {
		if loaded[name] {
			mods[name] = true
			continue
		}
		_, err := os.Stat(filepath.Join(sysRoot, "module", name))
		mods[name] = err == nil
	}
	return mods, nil
}

// pciFunc is one parsed entry of <sys>/bus/pci/devices.
type pciFunc struct {
	PCIDevice
	vendor, class uint32
	dir           string
}

// scanPCI lists PCI functions sorted by address. A missing devices dir
// means no devices; a function whose vendor or class cannot be read is
// skipped.
func scanPCI(ctx context.Context, sysRoot string) ([]pciFunc, error) {
	root := filepath.Join(sysRoot, "bus", "pci", "devices")
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pci devices: %w", err)
	}
	out := make([]pciFunc, 0, len(ents))
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("scan pci devices: %w", err)
		}
		dir := filepath.Join(root, e.Name())
		vendor, err1 := readHex(filepath.Join(dir, "vendor"))
		class, err2 := readHex(filepath.Join(dir, "class"))
		if err1 != nil || err2 != nil {
			continue
		}
		device, _ := readHex(filepath.Join(dir, "device"))
		f := pciFunc{vendor: vendor, class: class, dir: dir}
		f.Address = e.Name()
		f.Vendor = fmt.Sprintf("0x%04x", vendor)
		f.VendorName = vendorName(vendor)
		f.Device = fmt.Sprintf("0x%04x", device)
		f.Class = fmt.Sprintf("0x%06x", class)
		f.NUMANode = -1
		if s, err := readTrim(filepath.Join(dir, "numa_node")); err == nil {
			if n, err := strconv.Atoi(s); err == nil {
				f.NUMANode = n
			}
		}
		if l, err := os.Readlink(filepath.Join(dir, "driver")); err == nil {
			f.Driver = filepath.Base(l)
		}
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out, nil
}

// isGPU: display controllers (class 0x03xxxx) from NVIDIA or AMD; Intel
// only for VGA (0x0300), 3D (0x0302) and other display (0x0380) so that
// other Intel functions never count.
func isGPU(vendor, class uint32) bool {
	if class>>16 != 0x03 {
		return false
	}
	switch vendor {
	case VendorNVIDIA, VendorAMD:
		return true
	case VendorIntel:
		switch class >> 8 {
		case 0x0300, 0x0302, 0x0380:
			return true
		}
	}
	return false
}

// isFabric: Mellanox network controllers (class 0x02xxxx: Ethernet or
// InfiniBand), which excludes bridges and management functions.
func isFabric(vendor, class uint32) bool {
	return vendor == VendorMellanox && class>>16 == 0x02
}

func vendorName(v uint32) string {
	switch v {
	case VendorNVIDIA:
		return "nvidia"
	case VendorAMD:
		return "amd"
	case VendorIntel:
		return "intel"
	case VendorMellanox:
		return "mellanox"
	}
	return ""
}

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

func readHex(path string) (uint32, error) {
	s, err := readTrim(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 32)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return uint32(n), nil
}
