package agent

import (
	"context"
	"os"
	"runtime"

	"github.com/shirou/gopsutil/v4/disk"
	"github.com/shirou/gopsutil/v4/host"
	"github.com/shirou/gopsutil/v4/mem"

	"github.com/drover-dev/drover/internal/api"
	"github.com/drover-dev/drover/internal/diag"
)

// capabilities describes this host for enrolment. Memory is total system
// memory, not the agent's heap (seed 003's bug).
func (a *Agent) capabilities(ctx context.Context) api.Capabilities {
	c := api.Capabilities{
		Hostname: a.cfg.Hostname, OSFamily: a.cfg.OSFamily, Arch: runtime.GOARCH,
		CPUCores: runtime.NumCPU(), SelectedAccel: a.cfg.QEMUAccel, AgentVersion: Version,
	}
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	if v, err := host.KernelVersionWithContext(ctx); err == nil {
		c.KernelVersion = v
	}
	if vm, err := mem.VirtualMemoryWithContext(ctx); err == nil {
		c.RAMTotalMB = int(vm.Total >> 20)
	}
	if du, err := disk.UsageWithContext(ctx, rootPath()); err == nil {
		c.DiskTotalGB = int(du.Total >> 30)
	}
	c.GPUCount = a.gpuCount(ctx)
	return c
}

// capacity is total, reserved, allocated (by running instances: none yet)
// and free capacity.
func (a *Agent) capacity(ctx context.Context) api.CapacityReport {
	var r api.CapacityReport
	r.Total.VCPUs = runtime.NumCPU()
	if vm, err := mem.VirtualMemoryWithContext(ctx); err == nil {
		r.Total.MemoryMiB = int(vm.Total >> 20)
	}
	if du, err := disk.UsageWithContext(ctx, a.cfg.StateDir); err == nil {
		r.Total.DiskGiB = int(du.Total >> 30)
	}
	r.Total.GPUs = a.gpuCount(ctx)
	r.Reserved = api.Capacity{VCPUs: a.cfg.ReservedVCPUs, MemoryMiB: a.cfg.ReservedMemoryMiB}
	r.Free = api.Capacity{
		VCPUs:     max(0, r.Total.VCPUs-r.Reserved.VCPUs-r.Allocated.VCPUs),
		MemoryMiB: max(0, r.Total.MemoryMiB-r.Reserved.MemoryMiB-r.Allocated.MemoryMiB),
		DiskGiB:   max(0, r.Total.DiskGiB-r.Reserved.DiskGiB-r.Allocated.DiskGiB),
		GPUs:      max(0, r.Total.GPUs-r.Reserved.GPUs-r.Allocated.GPUs),
	}
	return r
}

func rootPath() string {
	if runtime.GOOS == "windows" {
		return `C:\`
	}
	return "/"
}

// gpuCount counts GPUs on the PCI bus; 0 where there is no sysfs.
func (a *Agent) gpuCount(ctx context.Context) int {
	gpus, err := diag.GPUs(ctx, "")
	if err != nil {
		a.log.Debug("scan GPUs", "err", err)
	}
	return len(gpus)
}
