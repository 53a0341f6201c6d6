package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/oci"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/vmcgroup"
	"github.com/drover-dev/drover/internal/node/volume"
)

// newCgroups makes the memory cgroup manager (tests point it elsewhere).
var newCgroups = vmcgroup.New

// newNet makes the microVM network manager (tests point it elsewhere).
var newNet = netsetup.New

// Name is the adapter's registry name (NODE_AGENT_RUNTIME=qemu).
const Name = "qemu"

var (
	_ runtime.OrphanSweeper = (*Runtime)(nil)
	_ runtime.Releaser      = (*Runtime)(nil)
)

// Config is the QEMU runtime's own configuration: its NODE_AGENT_QEMU_*
// settings (Settings), parsed by ParseConfig. The accelerator is not here:
// the agent proves and selects it for the host (NODE_AGENT_QEMU_ACCEL,
// runtime.Options.Accel; docs/adr/0007-runtime-owned-config.md).
type Config struct {
	Binary string // NODE_AGENT_QEMU_BINARY / -qemu-binary
	// The microVM mode (docs/adr/0012-qemu-microvm.md): its kernel and the
	// initramfs `drover-init initramfs` built from the same kernel's
	// modules; with both set the runtime also offers "microvm".
	MicroVMKernel string // NODE_AGENT_QEMU_MICROVM_KERNEL
	MicroVMInitrd string // NODE_AGENT_QEMU_MICROVM_INITRD
	// CgroupParent is the memory cgroup under which every QEMU process
	// gets one of its own (NODE_AGENT_QEMU_CGROUP_PARENT, default
	// vmcgroup.DefaultParent); CgroupsOff ("none") turns them off.
	CgroupParent string
}

// CgroupsOff is the NODE_AGENT_QEMU_CGROUP_PARENT value that runs QEMU
// without memory cgroups.
const CgroupsOff = "none"

// Settings are the keys the QEMU runtime owns.
func Settings() []runtime.Setting {
	return []runtime.Setting{
		{Name: "BINARY", Usage: "QEMU system emulator (default qemu-system-<arch>)",
			Default: accel.QEMUBinary(goruntime.GOARCH)},
		{Name: "MICROVM_KERNEL", Usage: "kernel that boots microVMs (runtime microvm); empty: no microVMs"},
		{Name: "MICROVM_INITRD", Usage: "initramfs of drover-init and that kernel's modules (drover-init initramfs)"},
		{Name: "CGROUP_PARENT", Usage: "memory cgroup each QEMU process gets a cgroup of its own under (memory limit, OOM kills reported as oom_killed); none: no cgroups",
			Default: vmcgroup.DefaultParent},
	}
}

// ParseConfig builds the Config from the settings' values.
func ParseConfig(v runtime.Values) (Config, error) {
	c := Config{Binary: v["BINARY"], MicroVMKernel: v["MICROVM_KERNEL"], MicroVMInitrd: v["MICROVM_INITRD"],
		CgroupParent: v["CGROUP_PARENT"]}
	if c.CgroupParent == "" {
		c.CgroupParent = vmcgroup.DefaultParent
	}
	if strings.ContainsAny(c.CgroupParent, "/ \t") || c.CgroupParent == "." || c.CgroupParent == ".." {
		return c, fmt.Errorf("CGROUP_PARENT %q: a plain cgroup name or %q", c.CgroupParent, CgroupsOff)
	}
	if (c.MicroVMKernel == "") != (c.MicroVMInitrd == "") {
		return c, errors.New("MICROVM_KERNEL and MICROVM_INITRD go together")
	}
	for _, p := range []string{c.MicroVMKernel, c.MicroVMInitrd} {
		if p != "" && !filepath.IsAbs(p) {
			return c, fmt.Errorf("microVM kernel and initrd must be absolute paths: %q", p)
		}
	}
	return c, nil
}

// Entry is the QEMU runtime's registration:
// runtime.Registry{qemu.Name: qemu.Entry()}.
func Entry() runtime.Entry {
	return runtime.WithConfig(ParseConfig, Factory, Settings()...)
}

// Factory builds the QEMU runtime from the agent's options and its own
// config. It refuses to build without a working accelerator.
func Factory(ctx context.Context, o runtime.Options, c Config) (runtime.Runtime, error) {
	if o.Accel == "" {
		return nil, errors.New("no working accelerator for QEMU (is qemu-system installed? see docs/runbooks/accelerators.md)")
	}
	opts := Options{Root: o.Root, Images: o.Images, Accel: o.Accel, QEMUBinary: c.Binary,
		OnOrphanRemoved: o.OnOrphanRemoved, Log: o.Log}
	if o.HostRoot != "" {
		dev := filepath.Join(o.HostRoot, "dev")
		opts.DeviceDirs = []string{filepath.Join(dev, "disk", "by-id"), filepath.Join(dev, "nvme")}
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	if c.CgroupParent == CgroupsOff {
		log.Info("qemu: memory cgroups off (NODE_AGENT_QEMU_CGROUP_PARENT=none): no per-VM memory limit, an OOM kill is reported as a plain crash")
	} else if cg, err := newCgroups(vmcgroup.Options{Parent: c.CgroupParent}); err != nil {
		log.Warn("qemu: memory cgroups unavailable on this host: VMs run without a per-VM memory limit and an OOM kill is reported as a plain crash",
			"parent", c.CgroupParent, "err", err)
	} else {
		opts.Cgroups = cg
		log.Info("qemu: every VM runs in a memory cgroup of its own", "dir", cg.Dir())
	}
	if c.MicroVMKernel != "" {
		store, err := oci.New(oci.Options{Dir: filepath.Join(o.Root, "oci"), MaxBytes: o.OCICacheMaxBytes, AllowLocalURLs: o.Images.AllowsLocalURLs(), Log: o.Log})
		if err != nil {
			return nil, err
		}
		vols, err := volume.New(volume.Options{Dir: filepath.Join(o.Root, "volumes")})
		if err != nil {
			return nil, fmt.Errorf("qemu: microVM volumes: %w", err)
		}
		opts.MicroVM = &MicroVMOptions{Kernel: c.MicroVMKernel, Initrd: c.MicroVMInitrd, OCI: store, Volumes: vols}
		ncfg := netsetup.Config{Bridge: o.MicroVMBridge, CIDR: o.MicroVMCIDR, DNS: o.MicroVMDNS, StateDir: filepath.Join(o.Root, "net")}
		if err := os.MkdirAll(ncfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("qemu: microVM network state: %w", err)
		}
		if m, err := newNet(ncfg); err != nil {
			log.Warn("qemu: no microVM networking (network.mode bridge is refused); user networking works", "err", err)
		} else {
			opts.MicroVM.Net = m
		}
	}
	r, err := New(ctx, opts)
	if err != nil {
		return nil, err
	}
	return r, nil
}
