package diag

import (
	"context"
	"errors"
)

// GPUs lists the GPUs on the PCI bus under sysRoot ("/sys" when empty),
// for capability and capacity reports. No GPU, or no sysfs at all (non-Linux
// hosts), is an empty list, not an error.
func GPUs(ctx context.Context, sysRoot string) ([]PCIDevice, error) {
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	funcs, err := scanPCI(ctx, sysRoot)
	if err != nil {
		return nil, err
	}
	var out []PCIDevice
	for _, f := range funcs {
		if isGPU(f.vendor, f.class) {
			out = append(out, f.PCIDevice)
		}
	}
	return out, nil
}

// Facts are the host facts capability and capacity reports need, read the
// same portable way as the health probe (no cgo; per-OS files).
type Facts struct {
	KernelVersion string
	MemTotalMiB   int
	MemAvailMiB   int
	DiskTotalGiB  int // of the filesystem holding the path passed to HostFacts
	DiskFreeGiB   int
}

// HostFacts reads kernel version, memory and the usage of the filesystem
// holding path. Fields it cannot read stay zero; the first error is
// returned alongside whatever was read.
func HostFacts(ctx context.Context, path string) (Facts, error) {
	var f Facts
	var errs []error
	if v, err := hostKernelVersion(ctx); err == nil {
		f.KernelVersion = v
	} else {
		errs = append(errs, err)
	}
	if m, err := hostMemory(ctx); err == nil {
		f.MemTotalMiB, f.MemAvailMiB = int(m.total>>20), int(m.available>>20)
	} else {
		errs = append(errs, err)
	}
	if u, err := hostFSUsage(ctx, path); err == nil {
		f.DiskTotalGiB, f.DiskFreeGiB = int(u.total>>30), int(u.free>>30)
	} else {
		errs = append(errs, err)
	}
	return f, errors.Join(errs...)
}
