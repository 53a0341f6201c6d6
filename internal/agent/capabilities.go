package agent

import (
	"context"
	"os"
	"runtime"

	"github.com/drover-dev/drover/internal/api"
	"github.com/drover-dev/drover/internal/diag"
	"github.com/drover-dev/drover/internal/hostinfo"
)

// capabilities describes this host for enrolment. Memory is total system
// memory, not the agent's heap (seed 003's bug).
func (a *Agent) capabilities(ctx context.Context) api.Capabilities {
	a.mu.Lock()
	c := api.Capabilities{
		Hostname: a.cfg.Hostname, OSFamily: a.cfg.OSFamily, Arch: runtime.GOARCH,
		CPUCores: runtime.NumCPU(), SelectedAccel: a.cfg.QEMUAccel, AgentVersion: Version,
		Accelerators: a.accel.Working, AccelError: a.accelErr,
	}
	a.mu.Unlock()
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	inv, err := hostinfo.Collect(ctx, hostinfo.Config{})
	if err != nil {
		a.log.Warn("collect host inventory", "err", err)
	}
	for _, w := range inv.Warnings {
		a.log.Debug("host inventory", "warning", w)
	}
	fromInv := inv.Capabilities(a.cfg.StateDir)
	c.KernelVersion, c.RAMTotalMB, c.DiskTotalGB, c.GPUCount = fromInv.KernelVersion, fromInv.RAMTotalMB, fromInv.DiskTotalGB, fromInv.GPUCount
	if c.RAMTotalMB == 0 || c.KernelVersion == "" { // inventory incomplete: fall back to the basic facts
		if f, err := diag.HostFacts(ctx, a.cfg.StateDir); err == nil {
			c.KernelVersion, c.RAMTotalMB, c.DiskTotalGB = f.KernelVersion, f.MemTotalMiB, f.DiskTotalGiB
		}
	}
	c.Inventory = &inv
	return c
}

// capacity is total, reserved, allocated (by running instances: none yet)
// and free capacity.
func (a *Agent) capacity(ctx context.Context) api.CapacityReport {
	f, _ := diag.HostFacts(ctx, a.cfg.StateDir)
	var r api.CapacityReport
	r.Total = api.Capacity{VCPUs: runtime.NumCPU(), MemoryMiB: f.MemTotalMiB, DiskGiB: f.DiskTotalGiB, GPUs: a.gpuCount(ctx)}
	r.Reserved = api.Capacity{VCPUs: a.cfg.ReservedVCPUs, MemoryMiB: a.cfg.ReservedMemoryMiB}
	r.Free = api.Capacity{
		VCPUs:     max(0, r.Total.VCPUs-r.Reserved.VCPUs-r.Allocated.VCPUs),
		MemoryMiB: max(0, r.Total.MemoryMiB-r.Reserved.MemoryMiB-r.Allocated.MemoryMiB),
		DiskGiB:   max(0, r.Total.DiskGiB-r.Reserved.DiskGiB-r.Allocated.DiskGiB),
		GPUs:      max(0, r.Total.GPUs-r.Reserved.GPUs-r.Allocated.GPUs),
	}
	return r
}

// gpuCount counts GPUs on the PCI bus; 0 where there is no sysfs.
func (a *Agent) gpuCount(ctx context.Context) int {
	gpus, err := diag.GPUs(ctx, "")
	if err != nil {
		a.log.Debug("scan GPUs", "err", err)
	}
	return len(gpus)
}
