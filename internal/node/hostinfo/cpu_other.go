//go:build !dragonfly && !windows && !darwin

package hostinfo

import (
	"context"
	"runtime"

	"github.com/drover-dev/drover/internal/wire/api"
)

// hostCPU knows only the logical CPU count on the remaining OSes. Linux
// reads procfs (ReadCPU) and gets here only when Config.GOOS says
// otherwise, as in tests.
func hostCPU(context.Context) (api.CPUInfo, error) {
	return api.CPUInfo{Virtualization: []string{}, Threads: runtime.NumCPU(), Cores: runtime.NumCPU(), Sockets: 1}, nil
}
