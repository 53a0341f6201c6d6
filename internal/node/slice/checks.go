package slice

// Host readiness: KVM, IOMMU, CPU flags, modules, reboot markers, required
// commands and the slice network.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/hostinfo"
)

// IOMMUKernelArgs are the kernel arguments that turn the IOMMU on (or into
// passthrough mode), in the order they are reported.
func IOMMUKernelArgs() []string { return []string{"intel_iommu=on", "amd_iommu=on", "iommu=pt"} }

// Modules are the kernel modules reported in loaded_modules.
func Modules() []string {
	return []string{"vfio", "vfio_pci", "vfio_iommu_type1", "kvm", "kvm_intel", "kvm_amd",
		"mlx5_core", "mlx5_ib", "ib_ipoib", "openvswitch"}
}

// VFIOModules must all be loaded for passthrough.
func VFIOModules() []string { return []string{"vfio", "vfio_pci", "vfio_iommu_type1"} }

// RequiredCommands are the commands Drover's slice provisioning runs on
// the host (slice.vm_provision's host_dependencies looks the same up): the
// QEMU system emulator of goarch, which the qemu runtime starts, and
// qemu-img (image_write_convert). A missing one is a host blocker
// (command_missing:<cmd>).
func RequiredCommands(goarch string) []string {
	return []string{accel.QEMUBinary(goarch), "qemu-img"}
}

// SeedCommands are the provisioning tools of the platform Drover's slice
// contract comes from (prerequisites.required_commands is its field).
// Drover does not run them: it starts QEMU through its runtime instead of
// virt-install and virsh, builds the NoCloud seed in Go instead of
// cloud-localds, reads mountinfo instead of findmnt, and needs ovs-vsctl
// only for an Open vSwitch bridge, which its tap networking cannot use.
// They are reported (required false) and a missing one is a notice
// (command_absent:<cmd>), never a blocker.
func SeedCommands() []string {
	return []string{"cloud-localds", "virt-install", "virsh", "ovs-vsctl", "findmnt"}
}

// RebootMarkers are the files, relative to Config.RootDir, whose presence
// means a reboot is pending.
func RebootMarkers() []string { return []string{"var/run/reboot-required", "run/reboot-required"} }

// commandPackage names the Debian/Ubuntu package that installs a
// required command.
func commandPackage(cmd string) string {
	switch cmd {
	case "qemu-system-x86_64":
		return "qemu-system-x86"
	case "qemu-system-aarch64":
		return "qemu-system-arm"
	case "qemu-img":
		return "qemu-utils"
	}
	return "qemu-system"
}

func (d *Discoverer) hostChecks(_ context.Context, s *scan) error {
	pre := &s.topo.Prerequisites
	cfg := d.cfg
	if _, err := os.Stat(filepath.Join(cfg.DevRoot, "kvm")); err == nil {
		pre.KVMAvailable = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("stat /dev/kvm: %w", err)
	}
	groups, err := hostinfo.ReadIOMMUGroups(cfg.SysRoot)
	if err != nil {
		return err
	}
	pre.IOMMUGroupCount = len(groups)
	cmdline, err := hostinfo.KernelCmdline(cfg.ProcRoot)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, w := range cmdline {
		present[w] = true
	}
	for _, a := range IOMMUKernelArgs() {
		if present[a] {
			pre.IOMMUKernelArgs = append(pre.IOMMUKernelArgs, a)
		}
	}
	cpu, err := hostinfo.ReadCPU(cfg.ProcRoot, cfg.SysRoot)
	if err != nil {
		return err
	}
	for _, f := range cpu.Virtualization {
		pre.CPUVirtualization.VMX = pre.CPUVirtualization.VMX || f == "vmx"
		pre.CPUVirtualization.SVM = pre.CPUVirtualization.SVM || f == "svm"
	}
	if pre.LoadedModules, err = hostinfo.LoadedModules(cfg.ProcRoot, cfg.SysRoot, Modules()); err != nil {
		return err
	}
	var markers []string
	for _, m := range RebootMarkers() {
		if _, err := os.Stat(filepath.Join(cfg.RootDir, filepath.FromSlash(m))); err == nil {
			markers = append(markers, "/"+m)
		}
	}
	pre.RebootRequired = len(markers) > 0

	virt := pre.CPUVirtualization.VMX || pre.CPUVirtualization.SVM
	if !pre.KVMAvailable {
		msg := "/dev/kvm does not exist: load kvm_intel or kvm_amd"
		if !virt {
			msg = "/dev/kvm does not exist and the CPU shows no vmx/svm: enable virtualisation (VT-x/AMD-V) in firmware"
		}
		s.host = append(s.host, Blocker{Code: BlockerKVMUnavailable, Message: msg})
	}
	if !virt {
		s.host = append(s.host, Blocker{Code: BlockerCPUVirtMissing,
			Message: "the CPU flags show neither vmx (Intel VT-x) nor svm (AMD-V): enable virtualisation in firmware; nested guests need it passed through"})
	}
	if pre.IOMMUGroupCount == 0 {
		msg := "no IOMMU groups: add intel_iommu=on (Intel) or amd_iommu=on, and iommu=pt, to the kernel command line and reboot"
		if len(pre.IOMMUKernelArgs) > 0 {
			msg = "no IOMMU groups although the kernel command line has " + strings.Join(pre.IOMMUKernelArgs, " ") +
				": enable VT-d / AMD-Vi in firmware"
		}
		s.host = append(s.host, Blocker{Code: BlockerIOMMUDisabled, Message: msg})
	}
	var missing []string
	for _, m := range VFIOModules() {
		if !pre.LoadedModules[m] {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		s.host = append(s.host, Blocker{Code: BlockerVFIOModulesMissing,
			Message: "not loaded: " + strings.Join(missing, ", ") + ": modprobe vfio-pci (and list it in /etc/modules-load.d)"})
	}
	if pre.RebootRequired {
		s.host = append(s.host, Blocker{Code: BlockerRebootRequired,
			Message: "a reboot is pending (" + strings.Join(markers, ", ") + "): reboot before provisioning slices"})
	}
	return nil
}

func (d *Discoverer) commands(_ context.Context, s *scan) error {
	look := func(c string, required bool) {
		p, err := d.cfg.LookPath(c)
		if err == nil && p != "" {
			s.topo.Prerequisites.RequiredCommands[c] = Command{Present: true, Path: p, Required: required}
			return
		}
		s.topo.Prerequisites.RequiredCommands[c] = Command{Required: required}
		if required {
			s.host = append(s.host, Blocker{Code: BlockerCommandMissingPrefix + c,
				Message: fmt.Sprintf("%s is not installed: apt-get install %s", c, commandPackage(c))})
			return
		}
		s.notices = append(s.notices, Blocker{Code: NoticeCommandAbsentPrefix + c,
			Message: fmt.Sprintf("%s is not installed; Drover's slice provisioning does not use it (%s)", c, seedNote(c))})
	}
	for _, c := range RequiredCommands(d.cfg.GOARCH) {
		look(c, true)
	}
	for _, c := range SeedCommands() {
		look(c, false)
	}
	return nil
}

// seedNote says what Drover does instead of running a seed command.
func seedNote(cmd string) string {
	switch cmd {
	case "cloud-localds":
		return "the NoCloud seed ISO is built in Go"
	case "virt-install", "virsh":
		return "VMs are started and stopped through the qemu runtime"
	case "ovs-vsctl":
		return "needed only to manage an Open vSwitch bridge; tap networking uses a Linux bridge"
	case "findmnt":
		return "mounts are read from /proc/self/mountinfo"
	}
	return "informational"
}

func (d *Discoverer) network(_ context.Context, s *scan) error {
	cfg := d.cfg
	net := &s.topo.Prerequisites.SliceNetwork
	bridge := filepath.Join(cfg.SysRoot, "class", "net", net.OVSBridge)
	if _, err := os.Stat(bridge); err == nil {
		net.OVSBridgePresent = true
		_, berr := os.Stat(filepath.Join(bridge, "bridge"))
		_, oerr := os.Stat(filepath.Join(cfg.SysRoot, "class", "net", "ovs-system"))
		switch {
		case berr == nil:
			net.OVSBridgeKind = "linux_bridge"
		case oerr == nil:
			net.OVSBridgeKind = "ovs"
		default:
			net.OVSBridgeKind = "unknown"
		}
	}
	switch {
	case !net.OVSBridgePresent:
		s.host = append(s.host, Blocker{Code: BlockerOVSBridgeMissing,
			Message: fmt.Sprintf("bridge %s does not exist: set the agent's NODE_AGENT_SLICE_CIDR (it makes the bridge) or create it", net.OVSBridge)})
	case net.OVSBridgeKind == "linux_bridge":
		// What Drover's tap networking needs (the qemu runtime enslaves
		// taps with ip link): a notice, not a blocker.
		s.notices = append(s.notices, Blocker{Code: BlockerOVSBridgeNotOVS,
			Message: fmt.Sprintf("%s is a Linux bridge, not an Open vSwitch bridge: Drover's slice VMs use it as is", net.OVSBridge)})
	}
	if v, err := os.ReadFile(filepath.Join(cfg.ProcRoot, "sys", "net", "ipv4", "ip_forward")); err == nil {
		on := strings.TrimSpace(string(v)) == "1"
		net.IPForward = &on
		if !on {
			s.host = append(s.host, Blocker{Code: BlockerIPForwardDisabled,
				Message: "net.ipv4.ip_forward is 0: slice VMs get no egress; set it to 1 in /etc/sysctl.d"})
		}
	}
	nics, err := hostinfo.ScanNICs(cfg.SysRoot)
	if err != nil {
		return err
	}
	netplan := netplanText(cfg.RootDir)
	for _, n := range nics {
		if n.LinkType != "infiniband" {
			continue
		}
		net.IPoIBInterfaces = append(net.IPoIBInterfaces, IPoIBInterface{Name: n.Name, OperState: n.OperState,
			PCIAddress: n.PCIAddress, NetplanConfigured: strings.Contains(netplan, n.Name)})
	}
	return nil
}

// netplanText is the concatenated text of <root>/etc/netplan/*.y*ml.
func netplanText(root string) string {
	files, _ := filepath.Glob(filepath.Join(root, "etc", "netplan", "*.y*ml"))
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil {
			b.Write(data)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
