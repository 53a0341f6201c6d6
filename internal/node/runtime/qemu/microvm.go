package qemu

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"
	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/oci"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/volume"
	"github.com/drover-dev/drover/internal/wire/api"
)

// MicroVMName is the runtime name of the microVM mode
// (api.InstanceSpec.Runtime "microvm", runtime.VMSpec.MicroVM), listed
// by Names when the mode is configured (docs/adr/0012-qemu-microvm.md).
const MicroVMName = "microvm"

// configDriveName is the microVM's config drive in its instance
// directory; persisted.Seed names it (the instance's seed, as cloud-init's
// ISO is a VM's).
const configDriveName = "config.img"

// MicroVMOptions turn on the microVM mode: a spec with VM.MicroVM boots
// Kernel with Initrd (drover-init and the kernel's modules: `drover-init
// initramfs`), the image's root filesystem as a qcow2 overlay and a config
// drive, on QEMU's microvm machine (virt on arm64) with virtio-mmio.
type MicroVMOptions struct {
	Kernel string
	Initrd string
	// OCI pulls OCI images and builds their root filesystems; nil allows
	// only a disk image (a raw ext4 root filesystem) with a command.
	OCI *oci.Store
	// Net networks microVMs whose spec has network.mode bridge: a tap on
	// its bridge, an address from its CIDR (the config drive's static
	// address), NAT and the forwards as DNAT rules; nil refuses mode
	// bridge.
	Net *netsetup.Manager
	// Machine is the QEMU machine: "microvm" (virtio-mmio, no PCI, no
	// firmware tables to walk) or "q35" (virtio-pci, direct kernel boot).
	// "" picks microvm, except under TCG when the host's TSC rate is
	// unknown (TSCKHz 0): microvm has no HPET or ACPI PM timer, so a guest
	// kernel under TCG on a busy host that must calibrate its TSC against
	// the PIT can hang early in boot (seen here); q35 gives it those
	// references. arm64 uses virt.
	Machine string
	// Volumes keeps the named volumes microVMs mount (spec.volumes:
	// microvm_volumes.go); nil refuses a spec with volumes.
	Volumes *volume.Manager
	// TSCKHz is the host's TSC frequency in kHz (0: unknown). Under TCG
	// on amd64 the guest kernel is told it (tsc_early_khz): the microvm
	// machine has no HPET or ACPI PM timer, and a kernel that must
	// calibrate its TSC against the PIT on a busy host can hang early in
	// boot. TCG's RDTSC reads the host's TSC, so the host's rate is the
	// guest's. 0: New reads it from /proc/cpuinfo on linux/amd64
	// (hostTSCKHz).
	TSCKHz int
}

// Names are "qemu" and, with the microVM mode, "microvm".
func (r *Runtime) Names() []string {
	if r.opts.MicroVM == nil {
		return []string{Name}
	}
	return []string{Name, MicroVMName}
}

// validateMicroVM is validate for a microVM spec.
func (r *Runtime) validateMicroVM(spec runtime.Spec) error {
	id, vm, res := spec.ID, spec.VMOrZero(), spec.Resources
	if !runtime.ValidID(id) {
		return invalid(api.ReasonVMStartFailed, id, "id %q: want 1-63 of [a-z0-9_-], starting with a letter or digit", id)
	}
	mv := r.opts.MicroVM
	if mv == nil {
		return invalid(api.ReasonVMStartFailed, id, "runtime microvm: this agent has no microVM kernel (NODE_AGENT_QEMU_MICROVM_KERNEL)")
	}
	switch spec.Image.Kind {
	case runtime.ImageOCI:
		if spec.Image.Ref == "" {
			return invalid(api.ReasonImagePullFailed, id, "spec.image.ref is required")
		}
		if mv.OCI == nil {
			return invalid(api.ReasonImagePullFailed, id, "spec.image: this agent pulls no OCI images for microVMs")
		}
	case runtime.ImageDisk:
		if spec.Image.URL == "" || spec.Image.SHA256 == "" {
			return invalid(api.ReasonImagePullFailed, id, "spec.image needs an OCI reference, or a root filesystem's url and sha256")
		}
		if len(spec.Command) == 0 {
			return invalid(api.ReasonVMStartFailed, id, "spec.command: a root filesystem image has no image config; name the command")
		}
	default:
		return invalid(api.ReasonImagePullFailed, id, "spec.image.kind %q", spec.Image.Kind)
	}
	switch {
	case res.VCPUs < 1 || res.VCPUs > 1024:
		return invalid(api.ReasonVMStartFailed, id, "vcpus %d: want 1-1024", res.VCPUs)
	case res.MemoryMiB < 64 || res.MemoryMiB > 16<<20:
		return invalid(api.ReasonVMStartFailed, id, "memory_mib %d: want 64-16777216", res.MemoryMiB)
	case res.DiskGiB < 0:
		return invalid(api.ReasonRootfsBuildFailed, id, "disk_gib %d is negative", res.DiskGiB)
	case vm.BootDevice != "" || vm.Boot != nil || vm.CloudInit != nil || vm.SeedISO != "":
		return invalid(api.ReasonVMStartFailed, id, "a microVM boots the agent's kernel and drover-init: no boot_device, boot, cloud_init or seed_iso")
	case vm.Network.Mode == api.NetworkTap:
		return invalid(api.ReasonNetworkSetupFailed, id, "network.mode tap: a microVM has user networking or mode bridge")
	case vm.Network.Mode == api.NetworkBridge && mv.Net == nil:
		return invalid(api.ReasonNetworkSetupFailed, id, "network.mode bridge: this agent has no microVM networking (see its start log)")
	case len(spec.Volumes) > 0 && mv.Volumes == nil:
		return invalid(api.ReasonVolumeAttachFailed, id, "spec.volumes: this agent keeps no microVM volumes")
	case len(spec.Devices.PCI) > 0 || len(spec.Devices.GPUs) > 0:
		return invalid(api.ReasonVMStartFailed, id, "a microVM has no PCI bus: no devices")
	case vm.Accel != "" && vm.Accel != r.opts.Accel && vm.Accel != "tcg":
		return invalid(api.ReasonVMStartFailed, id, "accel %q: this host runs %q (or tcg)", vm.Accel, r.opts.Accel)
	case strings.ContainsAny(spec.Readiness.SerialMarker, "\r\n"):
		return invalid(api.ReasonVMStartFailed, id, "readiness.serial_marker must be one line")
	}
	if err := validateNetwork(vm.Network, spec.Ports); err != nil {
		return invalid(api.ReasonNetworkSetupFailed, id, "%v", err)
	}
	if err := validateVolumes(id, spec.Volumes); err != nil {
		return err
	}
	for name := range spec.Secrets {
		if !secretRE.MatchString(name) {
			return invalid(api.ReasonSecretsInjectionFailed, id, "secret name %q: want 1-128 of [A-Za-z0-9_.-]", name)
		}
	}
	if p := spec.Readiness.TCPPort; p != 0 && vm.Network.Mode != api.NetworkBridge {
		if _, ok := forwardFor(spec, p); !ok {
			return invalid(api.ReasonVMStartFailed, id, "readiness.tcp_port %d has no forward for that guest port", p)
		}
	}
	if n := len(filepath.Join(r.instDir, id, serialSock)); n > maxSunPath {
		return invalid(api.ReasonVMStartFailed, id, "socket path is %d bytes, over the unix socket limit %d (use a shorter root)", n, maxSunPath)
	}
	return nil
}

// prepareMicroVM makes a microVM's overlay of its root filesystem, its
// volumes and its config drive (with secrets, on Linux, the drive QEMU
// reads is a sealed memfd and config.img leaves them out:
// writeConfigDrive).
func (r *Runtime) prepareMicroVM(ctx context.Context, in *instance, spec runtime.Spec) error {
	id, mv := spec.ID, r.opts.MicroVM
	var base string
	var info image.Info
	var cfg guestinit.Config
	if spec.Image.IsOCI() {
		var auth []byte
		if n := spec.ContainerOrZero().RegistryAuth; n != "" {
			auth = spec.Secrets[n]
		}
		img, rfs, err := mv.OCI.Prepare(ctx, id, spec.Image.Ref, spec.Image.Digest, auth, nil)
		if err != nil {
			return err // image_pull_failed or rootfs_build_failed already
		}
		c := img.Config
		cfg = guestinit.Config{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, User: c.User, WorkingDir: c.WorkingDir}
		base, info = rfs.Path, image.Info{Format: image.FormatRaw, VirtualSize: rfs.Bytes}
		if fi, err := os.Stat(base); err == nil {
			info.VirtualSize = fi.Size()
		}
	} else {
		var err error
		if base, err = r.fetch(ctx, "spec.image", spec.Image.Artifact()); err != nil {
			return runtime.Errorf(api.ReasonImagePullFailed, "create", id, "%w", err)
		}
		if info, err = r.inspect(ctx, base, image.FormatRaw); err != nil {
			return runtime.Errorf(api.ReasonImagePullFailed, "create", id, "spec.image: %w", err)
		}
	}
	cfg = guestinit.Workload(cfg, spec.Command, spec.Args, spec.Env)
	cfg.Hostname, cfg.Secrets = id, spec.Secrets
	network := guestinit.UserNetwork
	if spec.VMOrZero().Network.Mode == api.NetworkBridge {
		// The address is leased now (a restart's Attach keeps it) so the
		// config drive can carry it; launch attaches the forwards.
		lease, err := mv.Net.Attach(ctx, id, nil)
		if err != nil {
			return err // network_setup_failed
		}
		network = bridgeNetwork(lease)
		in.st.LeaseIP = lease.IP.String()
	}
	cfg.Network = &network
	vols, drives, err := r.attachVolumes(ctx, id, spec.Volumes) // prepare's cleanup detaches them
	if err != nil {
		return err // volume_attach_failed
	}
	cfg.Volumes, in.st.Volumes = vols, drives
	drive, err := guestinit.EncodeConfig(cfg)
	if err != nil {
		reason := api.ReasonVMStartFailed
		if len(spec.Secrets) > 0 {
			reason = api.ReasonSecretsInjectionFailed
		}
		return runtime.Errorf(reason, "create", id, "config drive: %w", err)
	}
	overlay := filepath.Join(r.overlayDir, id+".qcow2")
	if err := CreateOverlay(ctx, r.opts.QEMUImg, base, info, overlay, spec.Resources.DiskGiB); err != nil {
		return runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "%w", err)
	}
	in.st.Disk, in.st.DiskFormat, in.st.Overlay = overlay, "qcow2", overlay
	if err := r.writeConfigDrive(in, cfg, drive); err != nil {
		return runtime.Errorf(api.ReasonSecretsInjectionFailed, "create", id, "config drive: %w", err)
	}
	in.st.Kernel, in.st.Initrd = mv.Kernel, mv.Initrd
	return nil
}

// writeConfigDrive writes a microVM's config drive (drive, cfg encoded)
// into its directory (0600). With secrets on Linux the file is cfg
// without them (the copy secretSeed builds the drive from again) and the
// drive QEMU gets is a sealed memfd (memseed.go).
func (r *Runtime) writeConfigDrive(in *instance, cfg guestinit.Config, drive []byte) error {
	path := in.path(configDriveName)
	if !memSeeds || len(cfg.Secrets) == 0 {
		in.st.Seed = path
		return atomicfile.Write(path, drive, 0o600)
	}
	cfg.Secrets = nil
	public, err := guestinit.EncodeConfig(cfg)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, public, 0o600); err != nil {
		return err
	}
	f, err := memSeedBytes(in.id, drive)
	if err != nil {
		return err
	}
	in.seed, in.st.SeedInMemory = f, true
	return nil
}

// bridgeNetwork is the guest side of a netsetup lease (drover-init
// configures eth0 from it).
func bridgeNetwork(l netsetup.Lease) guestinit.Network {
	n := guestinit.Network{Address: fmt.Sprintf("%s/%d", l.IP, l.Prefix), Gateway: l.Gateway.String()}
	dns := make([]string, 0, len(l.DNS))
	for _, d := range l.DNS {
		dns = append(dns, d.String())
	}
	n.DNS = strings.Join(dns, ",")
	return n
}

// bridgeForwards are the DNAT forwards of a microVM in mode bridge, with
// the host ports chosen for this run.
func bridgeForwards(ports []api.PortForward, hostPorts map[string]int) []netsetup.Forward {
	var fwds []netsetup.Forward
	for _, f := range ports {
		fwds = append(fwds, netsetup.Forward{Proto: "tcp", HostPort: hostPorts[forwardName(f)], GuestPort: f.GuestPort})
	}
	return fwds
}

// probeAddr is the address the readiness probe dials for a guest port:
// the lease's address in mode bridge (nothing in between accepts for the
// guest), else the forward's loopback port; direct says which.
func probeAddr(in *instance, guestPort int) (addr string, direct bool, err error) {
	in.mu.Lock()
	ip, ports := in.st.LeaseIP, in.st.Ports
	in.mu.Unlock()
	if ip != "" && in.spec.VMOrZero().Network.Mode == api.NetworkBridge {
		return net.JoinHostPort(ip, strconv.Itoa(guestPort)), true, nil
	}
	f, ok := forwardFor(in.spec, guestPort)
	if !ok {
		return "", false, fmt.Errorf("no forward for guest port %d", guestPort)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[forwardName(f)])), false, nil
}

// microvmCmdline is the guest kernel's command line; tscKHz (TCG on
// amd64 only, 0 for none) spares the kernel its TSC calibration
// (MicroVMOptions.TSCKHz).
func microvmCmdline(arch, accel string, tscKHz int) string {
	console := "ttyS0"
	if arch == "arm64" {
		console = "ttyAMA0"
	}
	line := "console=" + console + " quiet panic=-1 rdinit=/init"
	if arch == "amd64" && accel == "tcg" && tscKHz > 0 {
		line += " tsc_early_khz=" + strconv.Itoa(tscKHz)
	}
	return line
}

// hostTSCKHz is the host's TSC rate from /proc/cpuinfo's first "cpu MHz"
// line (x86 Linux; 0 elsewhere or when it cannot be read). In a VM (where
// TCG runs for want of nested KVM) that is the TSC rate the hypervisor
// gives; on bare metal with frequency scaling it is the current clock,
// which can differ from the constant TSC's rate: the guest then boots,
// but its early clock runs fast or slow until it switches clocksource.
// TCG runs on bare metal only where KVM does not work.
func hostTSCKHz(cpuinfo string) int {
	b, err := os.ReadFile(cpuinfo)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 || mhz > 100000 {
			return 0
		}
		return int(mhz * 1000)
	}
	return 0
}

// microvmCommandLine is CommandLine for a microVM: the microvm machine
// (virt on arm64), virtio-mmio disks found by serial, no PCI, no reboot
// (a guest reset or panic ends QEMU).
func microvmCommandLine(spec runtime.Spec, l Launch, machine string) []string {
	switch {
	case l.Arch != "amd64":
		machine = machineFor(l.Arch)
	case machine == "" && l.Accel == "tcg" && l.TSCKHz == 0:
		machine = "q35"
	case machine == "":
		machine = "microvm"
	}
	bus := "device" // virtio-mmio
	if machine != "microvm" {
		bus = "pci"
	}
	a := []string{"-name", "drover-" + spec.ID, "-machine", machine, "-accel", l.Accel}
	switch {
	case l.Accel == "kvm" || l.Accel == "hvf":
		a = append(a, "-cpu", "host")
	case l.Accel == "tcg" && machine == "virt":
		a = append(a, "-cpu", "max")
	}
	a = append(a,
		"-m", strconv.Itoa(spec.Resources.MemoryMiB),
		"-smp", strconv.Itoa(spec.Resources.VCPUs),
		"-nodefaults", "-no-user-config", "-no-reboot",
		"-display", "none", "-monitor", "none",
		"-kernel", l.Kernel, "-initrd", l.Initrd, "-append", microvmCmdline(l.Arch, l.Accel, l.TSCKHz),
		"-drive", "if=none,id=disk0,file="+qemuValue(l.Disk)+",format="+l.DiskFormat,
		"-device", "virtio-blk-"+bus+",drive=disk0,serial="+guestinit.RootSerial,
	)
	addFD, seedFile := seedArgs(l) // the config drive
	a = append(a, addFD...)
	a = append(a,
		"-drive", "if=none,id=cfg0,file="+seedFile+",format=raw,readonly=on",
		"-device", "virtio-blk-"+bus+",drive=cfg0,serial="+guestinit.ConfigSerial,
	)
	a = append(a, volumeArgs(l.Volumes, bus)...)
	net := netArgs(spec.VMOrZero().Network, spec.Ports, l)
	net[len(net)-1] = strings.Replace(net[len(net)-1], "virtio-net-pci", "virtio-net-"+bus, 1)
	a = append(a, net...)
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

// microvmVerdict refines how a microVM ended from the init's last report
// on the serial console since the run started: the workload's exit code,
// its OOM kill, or the init's failure. A requested stop stays a stop.
func (r *Runtime) microvmVerdict(in *instance, stopRequested bool, state runtime.State, reason api.ReasonCode, detail string) (runtime.State, api.ReasonCode, string) {
	in.mu.Lock()
	off := in.st.SerialOffset
	in.mu.Unlock()
	rep, ok := lastReport(in.path(serialLogName), off)
	switch {
	case !ok || stopRequested:
		return state, reason, detail
	case initVolumeFailure(rep):
		return runtime.StateCrashed, api.ReasonVolumeAttachFailed, "drover-init: " + rep.Error
	case rep.Event == guestinit.EventFailed:
		return runtime.StateCrashed, api.ReasonVMStartFailed, "drover-init: " + rep.Error
	case rep.Event != guestinit.EventExited:
		return state, reason, detail
	case rep.OOMKilled:
		return runtime.StateCrashed, api.ReasonOOMKilled, fmt.Sprintf("workload killed by the guest kernel's OOM killer (exit code %d)", rep.ExitCode)
	case rep.ExitCode == 0:
		return runtime.StateStopped, "", "workload exited with code 0"
	case rep.Signal != "":
		return runtime.StateCrashed, "", fmt.Sprintf("workload killed by %s (exit code %d)", rep.Signal, rep.ExitCode)
	}
	return runtime.StateCrashed, "", fmt.Sprintf("workload exited with code %d", rep.ExitCode)
}

// lastReport is the last init report in the serial log after off.
func lastReport(path string, off int64) (guestinit.Report, bool) {
	f, err := os.Open(path)
	if err != nil {
		return guestinit.Report{}, false
	}
	defer func() { _ = f.Close() }()
	if fi, err := f.Stat(); err == nil && fi.Size() < off {
		off = 0
	}
	b, err := io.ReadAll(io.NewSectionReader(f, off, 64<<20))
	if err != nil {
		return guestinit.Report{}, false
	}
	reps := guestinit.ParseReports(b)
	if len(reps) == 0 {
		return guestinit.Report{}, false
	}
	return reps[len(reps)-1], true
}

// probeReadiness is the readiness probe of the port: an HTTP GET of
// Readiness.HTTPPath through its forward (a 2xx or 3xx answer), else
// probeTCP.
func (r *Runtime) probeReadiness(ctx context.Context, in *instance, p *vmProc) error {
	rd := in.spec.Readiness
	if rd.HTTPPath == "" {
		return r.probeTCP(ctx, in, p)
	}
	addr, _, err := probeAddr(in, rd.TCPPort)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	url := "http://" + addr + rd.HTTPPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", rd.HTTPPath, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: HTTP %d", rd.HTTPPath, resp.StatusCode)
	}
	return nil
}
