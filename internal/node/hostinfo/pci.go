package hostinfo

// PCI functions under <sys>/bus/pci/devices and IOMMU groups under
// <sys>/kernel/iommu_groups. Plain file reads: they compile everywhere and
// find nothing where there is no sysfs.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// PCI vendor ids hostinfo classifies.
const (
	VendorNVIDIA   = 0x10de
	VendorAMD      = 0x1002
	VendorIntel    = 0x8086
	VendorMellanox = 0x15b3
)

// PCIDev is one PCI function as sysfs shows it.
type PCIDev struct {
	Address  string // "0000:3b:00.0"
	Vendor   uint32
	Device   uint32
	Class    uint32
	NUMANode int    // -1 when unknown
	Driver   string // basename of the driver link; "" when unbound
	// IOMMUGroup is the group number, -1 when the function has none (IOMMU off).
	IOMMUGroup int
	// PhysFn is the physical function's address when this is an SR-IOV VF.
	PhysFn        string
	SRIOVTotalVFs int
	SRIOVNumVFs   int
	VFs           []VF     // sorted by index
	NetInterfaces []string // names under <dev>/net, sorted
	Dir           string   // the sysfs directory
}

// VF is one virtfnN link of a physical function.
type VF struct {
	Index   int
	Address string
}

// ScanPCI lists PCI functions sorted by address. A missing devices
// directory means no devices; a function whose vendor or class cannot be
// read is skipped.
func ScanPCI(ctx context.Context, sysRoot string) ([]PCIDev, error) {
	root := join(sysRoot, "bus", "pci", "devices")
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pci devices: %w", err)
	}
	out := make([]PCIDev, 0, len(ents))
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("scan pci devices: %w", err)
		}
		if d, ok := readPCIDev(filepath.Join(root, e.Name()), e.Name()); ok {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out, nil
}

func readPCIDev(dir, addr string) (PCIDev, bool) {
	vendor, err1 := readHex(filepath.Join(dir, "vendor"))
	class, err2 := readHex(filepath.Join(dir, "class"))
	if err1 != nil || err2 != nil {
		return PCIDev{}, false
	}
	d := PCIDev{Address: addr, Vendor: vendor, Class: class, Dir: dir, NUMANode: -1, IOMMUGroup: -1}
	d.Device, _ = readHex(filepath.Join(dir, "device"))
	if n, err := readInt(filepath.Join(dir, "numa_node")); err == nil {
		d.NUMANode = n
	}
	d.Driver = linkBase(filepath.Join(dir, "driver"))
	if g := linkBase(filepath.Join(dir, "iommu_group")); g != "" {
		if n, err := strconv.Atoi(g); err == nil {
			d.IOMMUGroup = n
		}
	}
	d.PhysFn = linkBase(filepath.Join(dir, "physfn"))
	d.SRIOVTotalVFs, _ = readInt(filepath.Join(dir, "sriov_totalvfs"))
	d.SRIOVNumVFs, _ = readInt(filepath.Join(dir, "sriov_numvfs"))
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			idx, ok := strings.CutPrefix(e.Name(), "virtfn")
			if !ok {
				continue
			}
			n, err := strconv.Atoi(idx)
			if err != nil {
				continue
			}
			if a := linkBase(filepath.Join(dir, e.Name())); a != "" {
				d.VFs = append(d.VFs, VF{Index: n, Address: a})
			}
		}
	}
	sort.Slice(d.VFs, func(i, j int) bool { return d.VFs[i].Index < d.VFs[j].Index })
	if ents, err := os.ReadDir(filepath.Join(dir, "net")); err == nil {
		for _, e := range ents {
			d.NetInterfaces = append(d.NetInterfaces, e.Name())
		}
	}
	return d, true
}

// IndexPCI maps addresses to functions.
func IndexPCI(devs []PCIDev) map[string]PCIDev {
	m := make(map[string]PCIDev, len(devs))
	for _, d := range devs {
		m[d.Address] = d
	}
	return m
}

// IsGPU reports a display controller (class 0x03xxxx) from NVIDIA or AMD,
// or an Intel VGA (0x0300), 3D (0x0302) or other display (0x0380)
// controller, so that no other Intel function counts. BMC display chips
// (e.g. ASPEED) are not GPUs.
func IsGPU(vendor, class uint32) bool {
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

// IsFabric reports a Mellanox network controller (class 0x02xxxx: Ethernet
// or InfiniBand), which excludes bridges and management functions.
func IsFabric(vendor, class uint32) bool {
	return vendor == VendorMellanox && class>>16 == 0x02
}

// IsNVMeController reports an NVMe controller (class 0x010802).
func IsNVMeController(class uint32) bool { return class>>8 == 0x0108 }

// IsGPU reports whether d is a GPU (see the function IsGPU).
func (d PCIDev) IsGPU() bool { return IsGPU(d.Vendor, d.Class) }

// IsFabric reports whether d is a Mellanox network function (PF or VF).
func (d PCIDev) IsFabric() bool { return IsFabric(d.Vendor, d.Class) }

// IsBridge reports a PCI bridge (class 0x0604), which may share an IOMMU
// group with the devices behind it without harm.
func (d PCIDev) IsBridge() bool { return d.Class>>8 == 0x0604 }

// Slot is the domain:bus:device part of the address, shared by the
// functions of one card (a GPU and its audio function).
func (d PCIDev) Slot() string {
	if i := strings.LastIndexByte(d.Address, '.'); i > 0 {
		return d.Address[:i]
	}
	return d.Address
}

// IOMMUGroupPtr is the group as the wire types carry it: nil for none.
func (d PCIDev) IOMMUGroupPtr() *int {
	if d.IOMMUGroup < 0 {
		return nil
	}
	g := d.IOMMUGroup
	return &g
}

// API is d's wire identity; names may be nil.
func (d PCIDev) API(names *PCINames) api.PCIFunction {
	f := api.PCIFunction{
		Address:    d.Address,
		VendorID:   fmt.Sprintf("0x%04x", d.Vendor),
		DeviceID:   fmt.Sprintf("0x%04x", d.Device),
		Class:      fmt.Sprintf("0x%06x", d.Class),
		Driver:     d.Driver,
		NUMANode:   d.NUMANode,
		IOMMUGroup: d.IOMMUGroupPtr(),
	}
	f.VendorName, f.DeviceName = names.Lookup(d.Vendor, d.Device)
	return f
}

// VendorShortName is "nvidia", "amd", "intel", "mellanox" or "".
func VendorShortName(v uint32) string {
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

// ReadIOMMUGroups lists <sys>/kernel/iommu_groups sorted by id. No
// directory (IOMMU off, or not Linux) is an empty list.
func ReadIOMMUGroups(sysRoot string) ([]api.IOMMUGroup, error) {
	root := join(sysRoot, "kernel", "iommu_groups")
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return []api.IOMMUGroup{}, nil
	}
	if err != nil {
		return []api.IOMMUGroup{}, fmt.Errorf("list iommu groups: %w", err)
	}
	out := make([]api.IOMMUGroup, 0, len(ents))
	for _, e := range ents {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		g := api.IOMMUGroup{ID: id, Devices: []string{}}
		devs, _ := os.ReadDir(filepath.Join(root, e.Name(), "devices"))
		for _, d := range devs {
			g.Devices = append(g.Devices, d.Name())
		}
		sort.Strings(g.Devices)
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// linkBase is the last element of a symlink's target, "" when path is not
// a readable link.
func linkBase(path string) string {
	l, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(l)
}
