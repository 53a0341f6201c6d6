package diag

import (
	"context"
	"errors"
)

// Facts are the basic host facts the agent falls back on when the full inventory is incomplete, read the
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
