//go:build !dragonfly && !windows

package diag

// Host facts through gopsutil, used where procfs is not (darwin, tests)
// and for filesystem usage. DragonFly (gopsutil has only stubs there) and
// Windows (gopsutil needs WMI modules this go.mod lacks) have their own files.

import (
	"context"
	"fmt"

	"github.com/shirou/gopsutil/v4/disk"
	"github.com/shirou/gopsutil/v4/host"
	"github.com/shirou/gopsutil/v4/mem"
)

func hostKernelVersion(ctx context.Context) (string, error) {
	v, err := host.KernelVersionWithContext(ctx)
	if err != nil {
		return "", fmt.Errorf("kernel version: %w", err)
	}
	return v, nil
}

func hostMemory(ctx context.Context) (memInfo, error) {
	vm, err := mem.VirtualMemoryWithContext(ctx)
	if err != nil {
		return memInfo{}, fmt.Errorf("virtual memory: %w", err)
	}
	return memInfo{total: vm.Total, free: vm.Free, available: vm.Available}, nil
}

func hostFSUsage(ctx context.Context, path string) (fsUsage, error) {
	u, err := disk.UsageWithContext(ctx, path)
	if err != nil {
		return fsUsage{}, fmt.Errorf("filesystem usage of %s: %w", path, err)
	}
	return fsUsage{total: u.Total, free: u.Free, used: u.Used}, nil
}
