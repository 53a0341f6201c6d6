//go:build nvml && cgo && linux

package hostinfo

// NVIDIA detail through NVML (github.com/NVIDIA/go-nvml, which dlopens
// libnvidia-ml.so.1 at run time). Built only with -tags nvml and cgo; do
// not link the agent with -z now (go-nvml resolves symbols lazily).

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML lists NVIDIA GPUs through NVML; it fails when libnvidia-ml.so.1
// cannot be loaded (no driver).
func NVML(ctx context.Context) ([]NVIDIAGPU, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml init: %s", nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	driver, _ := nvml.SystemGetDriverVersion()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %s", nvml.ErrorString(ret))
	}
	gpus := make([]NVIDIAGPU, 0, n)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d: %s", i, nvml.ErrorString(ret))
		}
		g := NVIDIAGPU{Index: i, DriverVersion: driver, Source: "nvml"}
		g.Name, _ = dev.GetName()
		g.UUID, _ = dev.GetUUID()
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryMiB = int(mem.Total >> 20)
		}
		if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
			g.PCIAddress = NormalizePCIAddress(cString(pci.BusId[:]))
		}
		gpus = append(gpus, g)
	}
	return gpus, nil
}

func cString(b []uint8) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
