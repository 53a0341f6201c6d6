package qemu

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Launch is everything a QEMU command line depends on besides the spec:
// where the instance's files are and what Start chose (accelerator, host
// ports, tap device).
type Launch struct {
	Arch  string // GOARCH of the host (and guest)
	Accel string // kvm, nvmm, hvf, tcg

	Disk       string // the overlay, or the boot device
	DiskFormat string // "qcow2" or "raw"
	BlockDisk  bool   // Disk is a block device: no host page cache
	Seed       string // cloud-init seed ISO; "" for none
	SeedFD     bool   // the seed is in memory: QEMU inherits it as fd memSeedFD
	Kernel     string // direct boot kernel; "" for none
	Initrd     string // direct boot initrd; "" for none

	QMPSocket    string
	SerialSocket string
	SerialLog    string
	PIDFile      string

	Ports map[string]int // forward name → host port (user networking)
	Tap   string         // tap device name (tap networking)
	MAC   string         // the NIC's MAC when the spec names none (mode bridge: the lease's)

	Daemonize bool

	// Machine is a microVM's QEMU machine (MicroVMOptions.Machine).
	Machine string

	// Volumes are a microVM's named volumes, one virtio disk each.
	Volumes []VolumeDrive
	// TSCKHz is the host TSC rate a microVM's kernel is told under TCG
	// (MicroVMOptions.TSCKHz).
	TSCKHz int
}

// qemuValue escapes a value inside a comma-separated QEMU option string.
func qemuValue(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// machineFor returns the machine type for arch.
func machineFor(arch string) string {
	switch arch {
	case "arm64", "riscv64", "loong64":
		return "virt"
	}
	return "q35"
}

// CommandLine returns QEMU's arguments (without the binary) for spec as
// launched by l. It is a pure function: Start runs exactly this.
func CommandLine(spec runtime.Spec, l Launch) []string {
	vm := spec.VMOrZero()
	if vm.MicroVM {
		return microvmCommandLine(spec, l, l.Machine)
	}
	a := []string{
		"-name", "drover-" + spec.ID,
		"-machine", machineFor(l.Arch),
		"-accel", l.Accel,
	}
	switch {
	case l.Accel == "kvm" || l.Accel == "hvf":
		a = append(a, "-cpu", "host")
	case l.Accel == "tcg" && machineFor(l.Arch) == "virt":
		a = append(a, "-cpu", "max") // virt's default CPU is a 32-bit one
	}
	a = append(a,
		"-m", strconv.Itoa(spec.Resources.MemoryMiB),
		"-smp", strconv.Itoa(spec.Resources.VCPUs),
		"-nodefaults", "-no-user-config",
		"-display", "none", "-monitor", "none",
		// A guest kernel panic ends the process (GUEST_PANICKED, then
		// SHUTDOWN guest-panic) instead of pausing or rebooting silently.
		"-device", "pvpanic-pci",
		"-action", "panic=shutdown",
	)

	drive := "if=none,id=disk0,file=" + qemuValue(l.Disk) + ",format=" + l.DiskFormat
	if l.BlockDisk {
		drive += ",cache=none,aio=threads"
	}
	a = append(a, "-drive", drive, "-device", "virtio-blk-pci,drive=disk0,bootindex=1")
	if l.Seed != "" || l.SeedFD {
		addFD, file := seedArgs(l)
		a = append(a, addFD...)
		a = append(a,
			"-drive", "if=none,id=seed0,file="+file+",format=raw,media=cdrom,readonly=on",
			"-device", "virtio-scsi-pci,id=scsi0",
			"-device", "scsi-cd,bus=scsi0.0,drive=seed0",
		)
	}
	if l.Kernel != "" {
		a = append(a, "-kernel", l.Kernel)
		if l.Initrd != "" {
			a = append(a, "-initrd", l.Initrd)
		}
		if vm.Boot != nil && vm.Boot.Cmdline != "" {
			a = append(a, "-append", vm.Boot.Cmdline)
		}
	}

	a = append(a, netArgs(vm.Network, spec.Ports, l)...)
	for _, bdf := range spec.Devices.PCI {
		a = append(a, "-device", "vfio-pci,host="+bdf)
	}

	a = append(a,
		"-chardev", "socket,id=ser0,path="+qemuValue(l.SerialSocket)+",server=on,wait=off,logfile="+
			qemuValue(l.SerialLog)+",logappend=on",
		"-serial", "chardev:ser0",
		"-chardev", "socket,id=qmp0,path="+qemuValue(l.QMPSocket)+",server=on,wait=off",
		"-mon", "chardev=qmp0,mode=control",
		"-pidfile", l.PIDFile,
	)
	if l.Daemonize {
		a = append(a, "-daemonize")
	}
	return a
}

// netArgs returns the netdev and NIC of the instance (ports are the
// user-mode forwards).
func netArgs(n runtime.VMNetwork, ports []api.PortForward, l Launch) []string {
	var netdev string
	switch n.Mode {
	case api.NetworkTap, api.NetworkBridge:
		netdev = "tap,id=n0,ifname=" + l.Tap + ",script=no,downscript=no"
	default:
		netdev = "user,id=n0"
		fwds := append([]api.PortForward(nil), ports...)
		sort.SliceStable(fwds, func(i, j int) bool { return forwardName(fwds[i]) < forwardName(fwds[j]) })
		for _, f := range fwds {
			netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", l.Ports[forwardName(f)], f.GuestPort)
		}
	}
	nic := "virtio-net-pci,netdev=n0"
	if n.MAC != "" {
		nic += ",mac=" + n.MAC
	} else if l.MAC != "" {
		nic += ",mac=" + l.MAC
	}
	return []string{"-netdev", netdev, "-device", nic}
}

// forwardName is a forward's key in Status.Ports: its name, or its guest
// port when unnamed.
func forwardName(f api.PortForward) string {
	if f.Name != "" {
		return f.Name
	}
	return strconv.Itoa(f.GuestPort)
}
