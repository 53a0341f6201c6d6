//go:build !dragonfly && !windows

package hostinfo

// Host facts through gopsutil where there is no procfs (darwin, the BSDs)
// and for filesystem usage everywhere but DragonFly and Windows: DragonFly
// has only gopsutil stubs, and gopsutil's Windows build needs WMI modules
// this go.mod does not carry. Those two have their own files.

import (
	"context"
	"fmt"

	"github.com/shirou/gopsutil/v4/disk"
	"github.com/shirou/gopsutil/v4/host"
	"github.com/shirou/gopsutil/v4/mem"
)

// KernelVersion is the running kernel's version.
func KernelVersion(ctx context.Context) (string, error) {
	v, err := host.KernelVersionWithContext(ctx)
	if err != nil {
		return "", fmt.Errorf("kernel version: %w", err)
	}
	return v, nil
}

// Memory is system memory.
func Memory(ctx context.Context) (Meminfo, error) {
	vm, err := mem.VirtualMemoryWithContext(ctx)
	if err != nil {
		return Meminfo{}, fmt.Errorf("virtual memory: %w", err)
	}
	return Meminfo{Total: vm.Total, Free: vm.Free, Available: vm.Available, SwapTotal: vm.SwapTotal}, nil
}

// FSUsageOf measures the filesystem holding path.
func FSUsageOf(ctx context.Context, path string) (FSUsage, error) {
	u, err := disk.UsageWithContext(ctx, path)
	if err != nil {
		return FSUsage{}, fmt.Errorf("filesystem usage of %s: %w", path, err)
	}
	return FSUsage{Total: u.Total, Free: u.Free, Used: u.Used}, nil
}

func hostMounts(ctx context.Context) ([]Mount, error) {
	parts, err := disk.PartitionsWithContext(ctx, false)
	if err != nil {
		return nil, fmt.Errorf("list filesystems: %w", err)
	}
	out := make([]Mount, 0, len(parts))
	for _, p := range parts {
		out = append(out, Mount{Device: p.Device, MountPoint: p.Mountpoint, FSType: p.Fstype})
	}
	return out, nil
}
