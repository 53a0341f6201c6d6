package agent

import (
	"context"
	"os"
	"runtime"

	"github.com/drover-dev/drover/internal/node/diag"
	"github.com/drover-dev/drover/internal/node/hostinfo"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// capabilities describes this host for enrolment. Memory is total system
// memory, not the agent's heap (reporting the heap was a known bug).
func (a *Agent) capabilities(ctx context.Context) api.Capabilities {
	a.mu.Lock()
	c := api.Capabilities{
		Hostname: a.cfg.Hostname, OSFamily: a.cfg.OSFamily, Arch: runtime.GOARCH,
		CPUCores: runtime.NumCPU(), SelectedAccel: a.cfg.QEMUAccel, AgentVersion: Version,
		Accelerators: a.accel.Working, AccelError: a.accelErr, ControlPlaneURL: a.cfg.ControlPlaneURL, TerminalURL: a.cfg.terminalURL(),
		LocalWorkloads: a.cfg.Local.Requests(),
	}
	if subnet := a.cfg.sliceSubnet(); subnet.IsValid() {
		c.SliceNetwork = &api.SliceNetwork{Bridge: a.cfg.SliceBridge, CIDR: subnet.String()}
	}
	a.mu.Unlock()
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	ic := a.cfg.inventoryConfig()
	ic.PCINames = &a.pciNames
	inv, err := hostinfo.Collect(ctx, ic)
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
	a.mu.Lock()
	a.total = api.Capacity{VCPUs: c.CPUCores, MemoryMiB: c.RAMTotalMB, DiskGiB: c.DiskTotalGB, GPUs: c.GPUCount}
	a.gpus = inv.GPUs
	vms := a.vms
	a.mu.Unlock()
	if vms != nil {
		c.Runtimes, c.ContainerEngine, c.ContainerEngineVersion = describeRuntime(vms.rt)
	}
	return c
}

// describeRuntime names the runtimes behind rt and its container engine,
// for placement (runtime.Multi, runtime.EngineReporter).
func describeRuntime(rt noderuntime.Runtime) (names []string, engine, version string) {
	names = []string{rt.Name()}
	if m, ok := rt.(noderuntime.Multi); ok {
		names = m.Names()
	}
	if e, ok := rt.(noderuntime.EngineReporter); ok {
		engine, version = e.ContainerEngine()
	}
	return names, engine, version
}

// hostGPUs are the GPUs of the last inventory.
func (a *Agent) hostGPUs() []api.GPU {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gpus
}

// capacity is total, reserved, allocated (by the reconciler's instances)
// and free capacity. Totals come from the last inventory (collected at
// start and by the capabilities loop), so a heartbeat reads no sysfs.
func (a *Agent) capacity(ctx context.Context) api.CapacityReport {
	a.mu.Lock()
	total, vms := a.total, a.vms
	a.mu.Unlock()
	if total.VCPUs == 0 { // no inventory yet
		a.capabilities(ctx)
		a.mu.Lock()
		total = a.total
		a.mu.Unlock()
	}
	r := api.CapacityReport{Total: total,
		Reserved: api.Capacity{VCPUs: a.cfg.ReservedVCPUs, MemoryMiB: a.cfg.ReservedMemoryMiB}}
	if vms != nil {
		r.Allocated = vms.rec.Allocated()
	}
	r.Free = api.Capacity{
		VCPUs:     max(0, r.Total.VCPUs-r.Reserved.VCPUs-r.Allocated.VCPUs),
		MemoryMiB: max(0, r.Total.MemoryMiB-r.Reserved.MemoryMiB-r.Allocated.MemoryMiB),
		DiskGiB:   max(0, r.Total.DiskGiB-r.Reserved.DiskGiB-r.Allocated.DiskGiB),
		GPUs:      max(0, r.Total.GPUs-r.Reserved.GPUs-r.Allocated.GPUs),
	}
	return r
}
