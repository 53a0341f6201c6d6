package slicevm

// Host checks below SysfsRoot: commands, KVM and VFIO, driver binding,
// the OVS bridge and the NVMe devices.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/hostinfo"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/wire/task"
)

// vfioDriver is the driver passthrough devices must be bound to.
const vfioDriver = "vfio-pci"

// root returns a path below SysfsRoot.
func (p *Provisioner) root(parts ...string) string {
	return filepath.Join(append([]string{p.opts.SysfsRoot}, parts...)...)
}

// commands are the host commands a provision uses.
type commands struct {
	qemuSystem, qemuImg, ovsVsctl string
}

// lookDependencies finds the commands the VM needs: found lists
// name=path, missing the commands (or the configured qemu-img path) not
// found.
func (p *Provisioner) lookDependencies(params task.VMProvisionParams) (c commands, found, missing []string) {
	look := func(name string, dst *string) {
		path, err := p.opts.LookPath(name)
		if err != nil {
			missing = append(missing, name)
			return
		}
		*dst = path
		found = append(found, name+"="+path)
	}
	look(accel.QEMUBinary(p.goarch()), &c.qemuSystem)
	if p.opts.QEMUImg != "" {
		if fi, err := os.Stat(p.opts.QEMUImg); err != nil || fi.IsDir() {
			missing = append(missing, p.opts.QEMUImg)
		} else {
			c.qemuImg = p.opts.QEMUImg
			found = append(found, "qemu-img="+p.opts.QEMUImg)
		}
	} else {
		look("qemu-img", &c.qemuImg)
	}
	if len(params.Slots) > 0 && params.OVSBridge != "" && !p.linuxBridge(params.OVSBridge) {
		look("ovs-vsctl", &c.ovsVsctl)
	}
	return c, found, missing
}

// missingDependency is the blocker error for missing commands.
func missingDependency(missing []string, why string) error {
	blockers := make([]string, len(missing))
	for i, m := range missing {
		blockers[i] = "command_missing:" + m
	}
	return blockf(CodeMissingDependency, strings.Join(blockers, ","),
		"required commands not found: %s (%s)", strings.Join(missing, ", "), why)
}

// hostPassthroughCheck checks the accelerator and, with slots, /dev/kvm
// and the vfio-pci driver. It loads no modules.
func (p *Provisioner) hostPassthroughCheck(ctx context.Context, params task.VMProvisionParams) (step, error) {
	name := params.Accel
	if name == "" {
		name = "runtime default"
	}
	details := []string{"runtime " + p.opts.Runtime.Name()}
	if p.opts.CheckAccel != nil {
		if err := p.opts.CheckAccel(ctx, params.Accel); err != nil {
			return step{}, blockf(CodeAccelUnavailable, "accel_unavailable:"+name, "accelerator %s does not work here: %w", name, err)
		}
		details = append(details, "accel "+name+" works")
	} else {
		details = append(details, "accel "+name+" not checked (no accelerator check configured)")
	}
	if len(params.Slots) == 0 {
		return done("%s; no slots: no passthrough needed", strings.Join(details, "; ")), nil
	}
	if !exists(p.root("dev", "kvm")) {
		return step{}, blockf(CodePassthroughMissing, "kvm_missing", "%s does not exist: GPU passthrough needs KVM", p.root("dev", "kvm"))
	}
	if fi, err := os.Stat(p.root("sys", "bus", "pci", "drivers", vfioDriver)); err != nil || !fi.IsDir() {
		return step{}, blockf(CodePassthroughMissing, "vfio_pci_missing",
			"the vfio-pci driver is not loaded (run modprobe vfio-pci; a provision does not load modules)")
	}
	return done("%s; /dev/kvm present; vfio-pci driver present", strings.Join(details, "; ")), nil
}

// passthroughDevices are the slots' GPUs and fabric VFs, in slot order.
func passthroughDevices(slots []task.VMSlot) []string {
	var out []string
	for _, s := range slots {
		out = append(out, s.PCIAddress)
		if s.FabricDevice != "" {
			out = append(out, s.FabricDevice)
		}
	}
	return out
}

// bindVFIO makes sure every device is bound to vfio-pci (binding it
// through driver_override and drivers_probe when it is not), then checks
// that each one's IOMMU group holds nothing bound to a host driver.
func (p *Provisioner) bindVFIO(ctx context.Context, addrs []string) (step, error) {
	if len(addrs) == 0 {
		return skipped("no slots"), nil
	}
	var rebound []string
	for _, a := range addrs {
		if err := ctx.Err(); err != nil {
			return step{}, err
		}
		changed, err := p.ensureVFIO(ctx, a)
		if err != nil {
			return step{}, err
		}
		if changed {
			rebound = append(rebound, a)
		}
	}
	for _, a := range addrs {
		if err := p.iommuGroupViable(a); err != nil {
			return step{}, err
		}
	}
	if len(rebound) == 0 {
		return done("%d devices already bound to vfio-pci", len(addrs)), nil
	}
	return done("%d devices bound to vfio-pci (bound now: %s)", len(addrs), strings.Join(rebound, ", ")), nil
}

func (p *Provisioner) pciDev(addr string, parts ...string) string {
	return p.root(append([]string{"sys", "bus", "pci", "devices", addr}, parts...)...)
}

// driverOf returns the driver addr is bound to ("" for none).
func (p *Provisioner) driverOf(addr string) (string, error) {
	link, err := os.Readlink(p.pciDev(addr, "driver"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return filepath.Base(link), nil
}

// ensureVFIO binds addr to vfio-pci unless it is; changed says it was not.
func (p *Provisioner) ensureVFIO(ctx context.Context, addr string) (changed bool, err error) {
	if !exists(p.pciDev(addr)) {
		return false, blockf(CodeVFIOBindFailed, "pci_device_missing:"+addr, "PCI device %s not found under %s",
			addr, p.root("sys", "bus", "pci", "devices"))
	}
	drv, err := p.driverOf(addr)
	if err != nil {
		return false, failf(CodeVFIOBindFailed, "read driver of %s: %w", addr, err)
	}
	if drv == vfioDriver {
		return false, nil
	}
	fail := func(format string, args ...any) error {
		return blockf(CodeVFIOBindFailed, "vfio_not_bound:"+addr, "bind %s (driver %q) to vfio-pci: %s",
			addr, drv, fmt.Sprintf(format, args...))
	}
	if err := writeSysfs(p.pciDev(addr, "driver_override"), vfioDriver); err != nil {
		return false, fail("set driver_override: %v", err)
	}
	if drv != "" {
		if err := writeSysfs(p.pciDev(addr, "driver", "unbind"), addr); err != nil {
			return false, fail("unbind from %s: %v", drv, err)
		}
	}
	if err := writeSysfs(p.root("sys", "bus", "pci", "drivers_probe"), addr); err != nil {
		return false, fail("drivers_probe: %v", err)
	}
	// drivers_probe binds synchronously; allow the link a moment to show.
	for i := 0; ; i++ {
		now, err := p.driverOf(addr)
		if err == nil && now == vfioDriver {
			p.opts.Log.Info("slicevm: bound device to vfio-pci", "pci_address", addr, "previous_driver", drv)
			return true, nil
		}
		if i == 10 {
			return false, fail("still bound to %q after drivers_probe", now)
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeSysfs writes an attribute that must already exist (sysfs files are
// never created).
func writeSysfs(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// iommuGroupViable checks that addr has an IOMMU group whose other members
// are unbound, bound to vfio-pci, or PCIe ports.
func (p *Provisioner) iommuGroupViable(addr string) error {
	members, err := os.ReadDir(p.pciDev(addr, "iommu_group", "devices"))
	if err != nil {
		return blockf(CodeVFIOBindFailed, "iommu_group_missing:"+addr,
			"%s has no IOMMU group (enable the IOMMU: intel_iommu=on or amd_iommu=on): %v", addr, err)
	}
	for _, m := range members {
		if m.Name() == addr {
			continue
		}
		drv, err := p.driverOf(m.Name())
		if err != nil {
			return failf(CodeVFIOBindFailed, "read driver of %s: %w", m.Name(), err)
		}
		switch drv {
		case "", vfioDriver, "pcieport", "pci-stub":
		default:
			return blockf(CodeVFIOBindFailed, "iommu_group_not_viable:"+addr,
				"%s shares its IOMMU group with %s, bound to host driver %s", addr, m.Name(), drv)
		}
	}
	return nil
}

// linuxBridge is true when br is a Linux bridge (it has a bridge/
// directory in sysfs): the runtime enslaves taps to it with netlink, so
// it needs no ovs-vsctl.
func (p *Provisioner) linuxBridge(br string) bool {
	return exists(p.root("sys", "class", "net", br, "bridge"))
}

// checkBridge checks that the bridge a tap attaches to exists.
func (p *Provisioner) checkBridge(br string) error {
	if !exists(p.root("sys", "class", "net", br)) {
		return blockf(CodeRuntimeInvalid, "ovs_bridge_missing:"+br, "bridge %s does not exist (%s)", br,
			p.root("sys", "class", "net", br))
	}
	return nil
}

// checkDevice resolves an NVMe device path and checks that it lies under
// DeviceDirs, is a block device or regular file, and is neither mounted,
// used as swap nor held (by device-mapper, md, ...). It returns the
// resolved path.
func (p *Provisioner) checkDevice(dev string) (string, error) {
	notAllowed := func(path string) error {
		return blockf(CodeRuntimeInvalid, "nvme_not_allowed:"+dev, "%s is not under the allowed device directories %s",
			path, strings.Join(p.opts.DeviceDirs, ", "))
	}
	clean := filepath.Clean(dev)
	if !p.underDeviceDirs(clean) {
		return "", notAllowed(clean)
	}
	resolved, err := filepath.EvalSymlinks(clean)
	if err != nil {
		return "", blockf(CodeRuntimeInvalid, "nvme_missing:"+dev, "nvme device %s: %v", dev, err)
	}
	if !p.underDeviceDirs(resolved) {
		return "", notAllowed(resolved)
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return "", blockf(CodeRuntimeInvalid, "nvme_missing:"+dev, "nvme device %s: %v", dev, err)
	}
	if m := fi.Mode(); !m.IsRegular() && (m&fs.ModeDevice == 0 || m&fs.ModeCharDevice != 0) {
		return "", blockf(CodeRuntimeInvalid, "nvme_not_block_device:"+dev, "%s is not a block device (%s)", resolved, m.Type())
	}
	name := filepath.Base(resolved)
	busy := func(format string, args ...any) error {
		return blockf(CodeRuntimeInvalid, "nvme_busy:"+dev, "%s (%s) is in use: %s", dev, name, fmt.Sprintf(format, args...))
	}
	mounts, err := p.mounts()
	if err != nil {
		return "", failf(CodeRuntimeInvalid, "cannot tell whether %s is mounted: %w", dev, err)
	}
	for _, m := range mounts {
		if src := resolveSource(m.Device); src == resolved || sameDiskOrPartition(filepath.Base(src), name) {
			return "", busy("%s is mounted at %s", m.Device, m.MountPoint)
		}
	}
	if b, err := os.ReadFile(p.root("proc", "swaps")); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if f := strings.Fields(line); len(f) > 0 && sameDiskOrPartition(filepath.Base(resolveSource(f[0])), name) {
				return "", busy("%s is used as swap", f[0])
			}
		}
	}
	if holders := p.holders(name); len(holders) > 0 {
		return "", busy("held by %s", strings.Join(holders, ", "))
	}
	return resolved, nil
}

func (p *Provisioner) underDeviceDirs(path string) bool {
	for _, d := range p.opts.DeviceDirs {
		if within(d, path) {
			return true
		}
		if r, err := filepath.EvalSymlinks(d); err == nil && within(r, path) {
			return true
		}
	}
	return false
}

// within reports whether p is root or lies below it (both clean).
func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// mounts reads SysfsRoot/proc/self/mountinfo (or mounts, where mountinfo
// is missing).
func (p *Provisioner) mounts() ([]hostinfo.Mount, error) {
	ms, err := hostinfo.ReadMountInfo(p.root("proc", "self", "mountinfo"))
	if err == nil {
		return ms, nil
	}
	ms, err2 := hostinfo.ReadMounts(p.root("proc", "self", "mounts"))
	if err2 != nil {
		return nil, errors.Join(err, err2)
	}
	return ms, nil
}

// resolveSource follows a mount source's symlinks (by-uuid, mapper).
func resolveSource(src string) string {
	if !filepath.IsAbs(src) {
		return src
	}
	if r, err := filepath.EvalSymlinks(src); err == nil {
		return r
	}
	return src
}

// sameDiskOrPartition reports whether name is disk or one of its
// partitions (nvme0n1p2 of nvme0n1, sda1 of sda; not nvme0n10).
func sameDiskOrPartition(name, disk string) bool {
	rest, ok := strings.CutPrefix(name, disk)
	if !ok {
		return false
	}
	if rest == "" {
		return true
	}
	if last := disk[len(disk)-1]; last >= '0' && last <= '9' {
		if rest, ok = strings.CutPrefix(rest, "p"); !ok {
			return false
		}
	}
	_, err := strconv.Atoi(rest)
	return err == nil && rest != "" && rest[0] != '-' && rest[0] != '+'
}

// holders lists what holds disk or its partitions (sys/block/<disk>/holders
// and sys/block/<disk>/<part>/holders).
func (p *Provisioner) holders(disk string) []string {
	var out []string
	dirs := []string{p.root("sys", "block", disk, "holders")}
	if ents, err := os.ReadDir(p.root("sys", "block", disk)); err == nil {
		for _, e := range ents {
			if sameDiskOrPartition(e.Name(), disk) && e.Name() != disk {
				dirs = append(dirs, p.root("sys", "block", disk, e.Name(), "holders"))
			}
		}
	}
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			out = append(out, e.Name())
		}
	}
	return out
}
