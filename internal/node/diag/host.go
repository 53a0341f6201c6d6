package diag

// Host facts through internal/node/hostinfo's per-OS readers (procfs-free:
// gopsutil, sysctl on DragonFly, kernel32 on Windows).

import (
	"context"

	"github.com/drover-dev/drover/internal/node/hostinfo"
)

type memInfo struct{ total, free, available uint64 } // bytes

func hostKernelVersion(ctx context.Context) (string, error) { return hostinfo.KernelVersion(ctx) }

func hostMemory(ctx context.Context) (memInfo, error) {
	m, err := hostinfo.Memory(ctx)
	return fromMeminfo(m), err
}

func fromMeminfo(m hostinfo.Meminfo) memInfo {
	return memInfo{total: m.Total, free: m.Free, available: m.Available}
}

func hostFSUsage(ctx context.Context, path string) (fsUsage, error) {
	u, err := hostinfo.FSUsageOf(ctx, path)
	return fsUsage{total: u.Total, free: u.Free, used: u.Used}, err
}
