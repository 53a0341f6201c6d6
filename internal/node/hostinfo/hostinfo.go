// Package hostinfo owns reading what a host is made of: CPU, memory, NUMA
// nodes, OS, disks, filesystems, NICs and the PCI devices that matter for
// placement (GPUs, Mellanox fabric adapters with their SR-IOV VFs, NVMe
// namespaces, IOMMU groups). Collect assembles an api.HostInventory; the
// lower-level readers (ScanPCI, ScanNVMe, ReadCPU, LoadedModules, ...) are
// exported for the task handlers that need the same facts (internal/node/diag,
// internal/node/slice).
//
// On Linux it reads sysfs, procfs and devfs below injected roots, so tests
// point it at fake trees; elsewhere it uses per-OS files (gopsutil where it
// works without extra modules, x/sys directly on DragonFly and Windows). It
// runs external commands (nvidia-smi) only through the injected Runner. It
// never changes host state, never talks to the network (a pci.ids database
// is read only when one is installed or PCIDB_PATH names it) and needs no
// cgo: NVML is used only when built with the "nvml" tag and cgo. It keeps no
// package-level mutable state and imports no Drover package but internal/wire/api.
package hostinfo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Runner runs a command and returns its standard output. Implementations
// must honour ctx. A command that is not installed returns an error that
// wraps exec.ErrNotFound.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// ExecRunner runs commands with os/exec; stderr is folded into the error.
func ExecRunner(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := bytes.TrimSpace(stderr.Bytes()); len(msg) > 0 {
			return out, fmt.Errorf("%s: %w: %s", name, err, firstLine(string(msg)))
		}
		return out, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

// FSUsage is a filesystem's size in bytes. Free is what an unprivileged
// writer can still use (statfs f_bavail); Used excludes reserved blocks.
type FSUsage struct{ Total, Free, Used uint64 }

// Config tells Collect where to look and how to reach the outside world.
// Zero fields take the defaults noted.
type Config struct {
	SysRoot  string // default "/sys"
	ProcRoot string // default "/proc"
	DevRoot  string // default "/dev"
	EtcRoot  string // default "/etc" (os-release)
	// DataRoot is where the well-known pci.ids locations are looked up
	// (usr/share/hwdata/pci.ids, usr/share/misc/pci.ids, .gz variants);
	// default "/".
	DataRoot string
	// PCIIDsPath names a pci.ids (or .gz) file; empty means $PCIDB_PATH,
	// then the well-known locations. None found: names are left empty.
	PCIIDsPath string
	// PCINames keeps the names across readings (the agent's, which reads
	// its host every 5 minutes); nil parses pci.ids at every reading.
	PCINames *PCINameCache
	// GOOS selects the Linux sysfs readers; default runtime.GOOS.
	GOOS string
	// GOARCH is reported as the architecture; default runtime.GOARCH.
	GOARCH string
	// Getenv reads the environment; default os.Getenv.
	Getenv func(string) string
	// Run runs nvidia-smi; default ExecRunner.
	Run Runner
	// NVML asks NVML for NVIDIA GPUs before nvidia-smi is tried; default
	// NVML, which needs the "nvml" build tag and cgo and otherwise reports
	// that it is not built in.
	NVML func(ctx context.Context) ([]NVIDIAGPU, error)
	// StatFS measures a mounted filesystem; default the host's statfs.
	StatFS func(ctx context.Context, path string) (FSUsage, error)
	// StatFSTimeout bounds each StatFS call; default 5s.
	StatFSTimeout time.Duration
	// Hostname returns the host name; default os.Hostname.
	Hostname func() (string, error)
	// Now stamps CollectedAt; default time.Now.
	Now func() time.Time
	// CommandTimeout bounds each external command; default 10s.
	CommandTimeout time.Duration
}

// WithDefaults returns cfg with every zero field set to its default.
func (cfg Config) WithDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&cfg.SysRoot, "/sys")
	def(&cfg.ProcRoot, "/proc")
	def(&cfg.DevRoot, "/dev")
	def(&cfg.EtcRoot, "/etc")
	def(&cfg.DataRoot, "/")
	def(&cfg.GOOS, runtime.GOOS)
	def(&cfg.GOARCH, runtime.GOARCH)
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if cfg.Run == nil {
		cfg.Run = ExecRunner
	}
	if cfg.NVML == nil {
		cfg.NVML = NVML
	}
	if cfg.StatFS == nil {
		cfg.StatFS = FSUsageOf
	}
	if cfg.Hostname == nil {
		cfg.Hostname = os.Hostname
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StatFSTimeout <= 0 {
		cfg.StatFSTimeout = 5 * time.Second
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = 10 * time.Second
	}
	return cfg
}

// Collect reads the inventory of this host. A section that cannot be read
// is left empty (lists are [] not null) and explained in Warnings; Collect
// returns an error only when ctx ends, together with what it had read.
func Collect(ctx context.Context, cfg Config) (api.HostInventory, error) {
	cfg = cfg.WithDefaults()
	inv := api.HostInventory{
		OS:          api.OSInfo{Family: api.OSFamilyOf(cfg.GOOS), Arch: cfg.GOARCH},
		CPU:         api.CPUInfo{Virtualization: []string{}},
		NUMANodes:   []api.NUMANode{},
		Disks:       []api.Disk{},
		Filesystems: []api.Filesystem{},
		NICs:        []api.NIC{},
		GPUs:        []api.GPU{},
		Fabric:      []api.FabricDevice{},
		NVMe:        []api.NVMeNamespace{},
		IOMMUGroups: []api.IOMMUGroup{},
		CollectedAt: cfg.Now().UTC(),
	}
	c := collector{cfg: cfg, inv: &inv}
	if h, err := cfg.Hostname(); err == nil {
		inv.Hostname = h
	} else {
		c.warn("hostname", err)
	}
	if cfg.GOOS == "linux" {
		c.linux(ctx)
	} else {
		c.portable(ctx)
	}
	c.nvidia(ctx)
	if err := ctx.Err(); err != nil {
		return inv, fmt.Errorf("hostinfo: collect interrupted: %w", err)
	}
	return inv, nil
}

// collector fills one inventory; it lives for one Collect call.
type collector struct {
	cfg Config
	inv *api.HostInventory
}

func (c *collector) warn(section string, err error) {
	c.inv.Warnings = append(c.inv.Warnings, api.InventoryWarning{Section: section, Message: err.Error()})
}

// linux reads everything from the configured sysfs/procfs/devfs roots.
func (c *collector) linux(ctx context.Context) {
	cfg := c.cfg
	inv := c.inv
	if v, err := readTrim(join(cfg.ProcRoot, "sys", "kernel", "osrelease")); err == nil {
		inv.OS.KernelVersion = v
	} else {
		c.warn("os", err)
	}
	inv.OS.Distribution = osRelease(join(cfg.EtcRoot, "os-release"))
	if cpu, err := ReadCPU(cfg.ProcRoot, cfg.SysRoot); err == nil {
		inv.CPU = cpu
	} else {
		c.warn("cpu", err)
	}
	if m, err := ReadMeminfo(join(cfg.ProcRoot, "meminfo")); err == nil {
		inv.Memory = m.API()
	} else {
		c.warn("memory", err)
	}
	if nodes, err := ReadNUMANodes(cfg.SysRoot); err == nil {
		inv.NUMANodes = nodes
	} else {
		c.warn("numa_nodes", err)
	}
	mounts, err := ReadMounts(join(cfg.ProcRoot, "self", "mounts"))
	if err != nil {
		c.warn("filesystems", err)
	}
	inv.Filesystems = c.filesystems(ctx, mounts)
	if swaps, err := ReadSwaps(join(cfg.ProcRoot, "swaps")); err == nil {
		mounts = append(mounts, swaps...)
	} else {
		c.warn("swaps", err)
	}
	pci, err := ScanPCI(ctx, cfg.SysRoot)
	if err != nil {
		c.warn("pci", err)
	}
	var names *PCINames
	if len(pci) > 0 {
		path := FindPCIIDs(cfg.PCIIDsPath, cfg.Getenv, cfg.DataRoot)
		if cfg.PCINames != nil {
			ids := make([][2]uint32, len(pci))
			for i, d := range pci {
				ids[i] = [2]uint32{d.Vendor, d.Device}
			}
			names, err = cfg.PCINames.Names(path, ids)
		} else {
			names, err = LoadPCINames(path)
		}
		if err != nil {
			c.warn("pci_ids", err)
		}
	}
	byAddr := IndexPCI(pci)
	if disks, nvme, err := ScanBlock(ctx, cfg.SysRoot, cfg.DevRoot, mounts, byAddr); err == nil {
		inv.Disks, inv.NVMe = disks, nvme
	} else {
		c.warn("disks", err)
	}
	if nics, err := ScanNICs(cfg.SysRoot); err == nil {
		inv.NICs = nics
	} else {
		c.warn("nics", err)
	}
	nicByName := make(map[string]api.NIC, len(inv.NICs))
	for _, n := range inv.NICs {
		nicByName[n.Name] = n
	}
	for _, d := range pci {
		switch {
		case d.IsGPU():
			inv.GPUs = append(inv.GPUs, api.GPU{PCIFunction: d.API(names), Vendor: VendorShortName(d.Vendor)})
		case d.IsFabric() && d.PhysFn == "":
			inv.Fabric = append(inv.Fabric, fabricDevice(d, names, byAddr, nicByName))
		}
	}
	if groups, err := ReadIOMMUGroups(cfg.SysRoot); err == nil {
		inv.IOMMUGroups = groups
	} else {
		c.warn("iommu_groups", err)
	}
}

func fabricDevice(d PCIDev, names *PCINames, byAddr map[string]PCIDev, nics map[string]api.NIC) api.FabricDevice {
	f := api.FabricDevice{PCIFunction: d.API(names), SRIOVTotalVFs: d.SRIOVTotalVFs, SRIOVNumVFs: d.SRIOVNumVFs,
		VFs: []api.VirtualFunction{}, Interfaces: []api.NIC{}}
	for _, vf := range d.VFs {
		v := api.VirtualFunction{Index: vf.Index, Address: vf.Address}
		if fn, ok := byAddr[vf.Address]; ok {
			v.Driver, v.IOMMUGroup = fn.Driver, fn.IOMMUGroupPtr()
		}
		f.VFs = append(f.VFs, v)
	}
	for _, name := range d.NetInterfaces {
		n, ok := nics[name]
		if !ok {
			n = api.NIC{Name: name}
		}
		f.Interfaces = append(f.Interfaces, n)
	}
	return f
}

// filesystems measures each real mounted filesystem once per mount point.
func (c *collector) filesystems(ctx context.Context, mounts []Mount) []api.Filesystem {
	out := []api.Filesystem{}
	seen := map[string]bool{}
	for _, m := range mounts {
		if PseudoFS(m.FSType) || seen[m.MountPoint] {
			continue
		}
		seen[m.MountPoint] = true
		u, err := c.statFS(ctx, m.MountPoint)
		if err != nil {
			c.warn("filesystems", err)
			continue
		}
		out = append(out, FilesystemOf(m, u))
	}
	return out
}

// statFS bounds one StatFS call by Config.StatFSTimeout: a hung network
// mount must not hold the inventory (the abandoned call only writes to a
// buffered channel).
func (c *collector) statFS(ctx context.Context, path string) (FSUsage, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatFSTimeout)
	defer cancel()
	type result struct {
		u   FSUsage
		err error
	}
	ch := make(chan result, 1)
	go func() {
		u, err := c.cfg.StatFS(ctx, path)
		ch <- result{u, err}
	}()
	select {
	case r := <-ch:
		return r.u, r.err
	case <-ctx.Done():
		return FSUsage{}, fmt.Errorf("filesystem usage of %s: %w", path, ctx.Err())
	}
}

// FilesystemOf combines a mount and its usage; UsedPercent is df's: the
// share of the space available to users that is in use.
func FilesystemOf(m Mount, u FSUsage) api.Filesystem {
	fs := api.Filesystem{Device: m.Device, MountPoint: m.MountPoint, FSType: m.FSType,
		TotalBytes: u.Total, UsedBytes: u.Used, FreeBytes: u.Free}
	if u.Used+u.Free > 0 {
		fs.UsedPercent = round2(float64(u.Used) / float64(u.Used+u.Free) * 100)
	}
	return fs
}

// portable reads what the per-OS files can on hosts without sysfs.
func (c *collector) portable(ctx context.Context) {
	inv := c.inv
	if v, err := KernelVersion(ctx); err == nil {
		inv.OS.KernelVersion = v
	} else {
		c.warn("os", err)
	}
	if m, err := Memory(ctx); err == nil {
		inv.Memory = m.API()
	} else {
		c.warn("memory", err)
	}
	if cpu, err := hostCPU(ctx); err == nil {
		inv.CPU = cpu
	} else {
		c.warn("cpu", err)
	}
	mounts, err := hostMounts(ctx)
	if err != nil {
		c.warn("filesystems", err)
	}
	inv.Filesystems = c.filesystems(ctx, mounts)
	if nics, err := portableNICs(); err == nil {
		inv.NICs = nics
	} else {
		c.warn("nics", err)
	}
}
