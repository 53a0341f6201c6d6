// Package hostinfotest builds fake sysfs, procfs and devfs trees for the
// tests of internal/node/hostinfo and internal/node/slice. A Host
// describes the machine; Build lays it out the way Linux does (device
// directories under sys/devices, with bus/pci/devices, class/net, block,
// kernel/iommu_groups and dev/disk/by-id as symlinks into them), so the
// code under test resolves links exactly as on a real host. Only tests
// import it.
package hostinfotest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// PCI is one PCI function. Empty strings leave the file out.
type PCI struct {
	Addr, Vendor, Device, Class string // "0000:3b:00.0", "0x10de", "0x2330", "0x030200"
	NUMA                        string
	Driver                      string // driver link basename
	IOMMUGroup                  string
	PhysFn                      string // PF address, for a VF
	SRIOVTotalVFs, SRIOVNumVFs  string
	VFs                         []string // virtfn0, virtfn1, ... targets
	Nets                        []Net
}

// Net is one network interface: under a PCI function, or virtual.
type Net struct {
	Name, OperState, Speed, Address, Type, MTU string
	// Bridge adds the bridge/ subdirectory a Linux bridge has.
	Bridge bool
}

// Block is one block device. For NVMe, PCIAddr names the controller
// function and Controller its name ("nvme0"); virtio disks set PCIAddr only.
type Block struct {
	Name, Controller, PCIAddr string
	Sectors                   string
	Model, Serial             string
	Rotational, Removable     string
	Partitions                []string
	Holders                   []string // of the whole device
	ByID                      []string // by-id link names pointing here
}

// CPU is one logical CPU's topology.
type CPU struct{ Package, Core string }

// NUMANode is one node directory.
type NUMANode struct {
	ID, CPUList string
	MemTotalKB  string
}

// Host describes a fake machine. Nil or empty fields leave files out.
type Host struct {
	CPUInfo   string
	Meminfo   string
	Modules   *string  // nil: no <proc>/modules
	Builtin   []string // <sys>/module/<name> directories
	Cmdline   string
	Kernel    string // <proc>/sys/kernel/osrelease
	Mounts    string // <proc>/self/mounts
	IPForward string // <proc>/sys/net/ipv4/ip_forward
	KVM       bool   // <dev>/kvm
	Topology  []CPU
	NUMA      []NUMANode
	NoPCIDir  bool
	PCI       []PCI
	Block     []Block
	Virtual   []Net // interfaces under devices/virtual/net
	// Files are extra files relative to the base directory, e.g.
	// "root/var/run/reboot-required" or "etc/os-release".
	Files map[string]string
}

// Roots are the directories of a built tree. Base holds them all; Root is
// Base/root, for configurable filesystem roots (marker files, pci.ids).
type Roots struct{ Base, Sys, Proc, Dev, Etc, Root string }

// Build writes h under a fresh t.TempDir().
func (h Host) Build(t testing.TB) Roots {
	t.Helper()
	r, err := h.BuildAt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// BuildAt writes h under base.
func (h Host) BuildAt(base string) (Roots, error) {
	b := &builder{r: Roots{Base: base, Sys: filepath.Join(base, "sys"), Proc: filepath.Join(base, "proc"),
		Dev: filepath.Join(base, "dev"), Etc: filepath.Join(base, "etc"), Root: filepath.Join(base, "root")}}
	for _, d := range []string{b.r.Sys, b.r.Proc, b.r.Dev, b.r.Etc, b.r.Root} {
		b.mkdir(d)
	}
	b.optFile(filepath.Join(b.r.Proc, "cpuinfo"), h.CPUInfo)
	b.optFile(filepath.Join(b.r.Proc, "meminfo"), h.Meminfo)
	if h.Modules != nil {
		b.file(filepath.Join(b.r.Proc, "modules"), *h.Modules)
	}
	for _, m := range h.Builtin {
		b.mkdir(filepath.Join(b.r.Sys, "module", m))
	}
	b.optFile(filepath.Join(b.r.Proc, "cmdline"), h.Cmdline)
	b.optFile(filepath.Join(b.r.Proc, "sys", "kernel", "osrelease"), h.Kernel)
	b.optFile(filepath.Join(b.r.Proc, "self", "mounts"), h.Mounts)
	b.optFile(filepath.Join(b.r.Proc, "sys", "net", "ipv4", "ip_forward"), h.IPForward)
	if h.KVM {
		b.file(filepath.Join(b.r.Dev, "kvm"), "")
	}
	for i, c := range h.Topology {
		dir := filepath.Join(b.r.Sys, "devices", "system", "cpu", fmt.Sprintf("cpu%d", i), "topology")
		b.file(filepath.Join(dir, "physical_package_id"), c.Package)
		b.file(filepath.Join(dir, "core_id"), c.Core)
	}
	for _, n := range h.NUMA {
		dir := filepath.Join(b.r.Sys, "devices", "system", "node", "node"+n.ID)
		b.file(filepath.Join(dir, "cpulist"), n.CPUList)
		b.file(filepath.Join(dir, "meminfo"), fmt.Sprintf("Node %s MemTotal:       %s kB\nNode %s MemFree:        1024 kB\n", n.ID, n.MemTotalKB, n.ID))
	}
	if !h.NoPCIDir {
		b.mkdir(filepath.Join(b.r.Sys, "bus", "pci", "devices"))
	}
	for _, p := range h.PCI {
		b.pci(p)
	}
	for _, blk := range h.Block {
		b.block(blk)
	}
	for _, n := range h.Virtual {
		dir := filepath.Join(b.r.Sys, "devices", "virtual", "net", n.Name)
		b.net(dir, n)
	}
	for rel, content := range h.Files {
		b.file(filepath.Join(base, filepath.FromSlash(rel)), content)
	}
	return b.r, b.err
}

type builder struct {
	r   Roots
	err error
}

func (b *builder) mkdir(dir string) {
	if b.err == nil {
		b.err = os.MkdirAll(dir, 0o755)
	}
}

func (b *builder) file(path, content string) {
	b.mkdir(filepath.Dir(path))
	if b.err == nil {
		if content != "" && !strings.HasSuffix(content, "\n") {
			content += "\n"
		}
		b.err = os.WriteFile(path, []byte(content), 0o644)
	}
}

func (b *builder) optFile(path, content string) {
	if content != "" {
		b.file(path, content)
	}
}

// link makes path a symlink to target, relative to path's directory as
// the kernel's are.
func (b *builder) link(target, path string) {
	b.mkdir(filepath.Dir(path))
	if b.err != nil {
		return
	}
	rel, err := filepath.Rel(filepath.Dir(path), target)
	if err != nil {
		b.err = err
		return
	}
	b.err = os.Symlink(rel, path)
}

// pciDir is where a function's directory lives: under its root bus.
func (b *builder) pciDir(addr string) string {
	bus := "pci" + addr
	if i := strings.IndexByte(addr, ':'); i >= 0 && len(addr) >= i+3 {
		bus = "pci" + addr[:i+3] // "pci0000:3b"
	}
	return filepath.Join(b.r.Sys, "devices", bus, addr)
}

func (b *builder) pci(p PCI) {
	dir := b.pciDir(p.Addr)
	b.file(filepath.Join(dir, "vendor"), p.Vendor)
	b.optFile(filepath.Join(dir, "device"), p.Device)
	b.file(filepath.Join(dir, "class"), p.Class)
	b.optFile(filepath.Join(dir, "numa_node"), p.NUMA)
	b.optFile(filepath.Join(dir, "sriov_totalvfs"), p.SRIOVTotalVFs)
	b.optFile(filepath.Join(dir, "sriov_numvfs"), p.SRIOVNumVFs)
	b.link(dir, filepath.Join(b.r.Sys, "bus", "pci", "devices", p.Addr))
	if p.Driver != "" {
		drv := filepath.Join(b.r.Sys, "bus", "pci", "drivers", p.Driver)
		b.mkdir(drv)
		b.link(drv, filepath.Join(dir, "driver"))
	}
	if p.IOMMUGroup != "" {
		group := filepath.Join(b.r.Sys, "kernel", "iommu_groups", p.IOMMUGroup)
		b.mkdir(filepath.Join(group, "devices"))
		b.link(group, filepath.Join(dir, "iommu_group"))
		b.link(dir, filepath.Join(group, "devices", p.Addr))
	}
	if p.PhysFn != "" {
		b.link(b.pciDir(p.PhysFn), filepath.Join(dir, "physfn"))
	}
	for i, vf := range p.VFs {
		b.link(b.pciDir(vf), filepath.Join(dir, fmt.Sprintf("virtfn%d", i)))
	}
	for _, n := range p.Nets {
		nd := filepath.Join(dir, "net", n.Name)
		b.net(nd, n)
		b.link(dir, filepath.Join(nd, "device"))
	}
}

func (b *builder) net(dir string, n Net) {
	b.optFile(filepath.Join(dir, "operstate"), n.OperState)
	b.optFile(filepath.Join(dir, "speed"), n.Speed)
	b.optFile(filepath.Join(dir, "address"), n.Address)
	typ := n.Type
	if typ == "" {
		typ = "1"
	}
	b.file(filepath.Join(dir, "type"), typ)
	b.optFile(filepath.Join(dir, "mtu"), n.MTU)
	if n.Bridge {
		b.mkdir(filepath.Join(dir, "bridge"))
	}
	b.link(dir, filepath.Join(b.r.Sys, "class", "net", n.Name))
}

func (b *builder) block(blk Block) {
	var dir string
	switch {
	case blk.Controller != "":
		ctrl := filepath.Join(b.pciDir(blk.PCIAddr), "nvme", blk.Controller)
		b.optFile(filepath.Join(ctrl, "model"), blk.Model)
		b.optFile(filepath.Join(ctrl, "serial"), blk.Serial)
		dir = filepath.Join(ctrl, blk.Name)
		b.link(ctrl, filepath.Join(dir, "device"))
	case blk.PCIAddr != "":
		dir = filepath.Join(b.pciDir(blk.PCIAddr), "virtio0", "block", blk.Name)
	default:
		dir = filepath.Join(b.r.Sys, "devices", "virtual", "block", blk.Name)
	}
	b.optFile(filepath.Join(dir, "size"), blk.Sectors)
	b.optFile(filepath.Join(dir, "queue", "rotational"), blk.Rotational)
	b.optFile(filepath.Join(dir, "removable"), blk.Removable)
	b.mkdir(filepath.Join(dir, "holders"))
	for _, h := range blk.Holders {
		b.mkdir(filepath.Join(dir, "holders", h))
	}
	for _, p := range blk.Partitions {
		b.mkdir(filepath.Join(dir, p, "holders"))
	}
	b.link(dir, filepath.Join(b.r.Sys, "block", blk.Name))
	for _, id := range blk.ByID {
		b.file(filepath.Join(b.r.Dev, blk.Name), "")
		b.link(filepath.Join(b.r.Dev, blk.Name), filepath.Join(b.r.Dev, "disk", "by-id", id))
	}
}

// Ptr returns a pointer to s (for Host.Modules).
func Ptr(s string) *string { return &s }
