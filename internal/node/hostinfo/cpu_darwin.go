//go:build darwin

package hostinfo

import (
	"context"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/drover-dev/drover/internal/wire/api"
)

// hostCPU answers through sysctl on darwin.
func hostCPU(context.Context) (api.CPUInfo, error) {
	c := api.CPUInfo{Virtualization: []string{}, Threads: runtime.NumCPU(), Cores: runtime.NumCPU(), Sockets: 1}
	c.Model, _ = unix.Sysctl("machdep.cpu.brand_string")
	c.Vendor, _ = unix.Sysctl("machdep.cpu.vendor")
	if n, err := unix.SysctlUint32("hw.physicalcpu"); err == nil && n > 0 {
		c.Cores = int(n)
	}
	if n, err := unix.SysctlUint32("hw.packages"); err == nil && n > 0 {
		c.Sockets = int(n)
	}
	if f, err := unix.Sysctl("machdep.cpu.features"); err == nil {
		for _, flag := range strings.Fields(strings.ToLower(f)) {
			if flag == "vmx" {
				c.Virtualization = append(c.Virtualization, "vmx")
			}
		}
	}
	return c, nil
}
