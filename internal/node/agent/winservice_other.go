//go:build !windows

package agent

import (
	"errors"
	"runtime"

	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
)

// errServiceUnsupported: `drover-agent service` manages Windows services
// only; other platforms have their own service files.
var errServiceUnsupported = errors.New("it manages the Windows service, and this is " + runtime.GOOS + ": run the agent with " + nativeService(runtime.GOOS) + " (docs/install.md)")

func nativeService(goos string) string {
	switch goos {
	case "linux":
		return "the systemd unit deploy/systemd/drover-agent.service"
	case "dragonfly", "freebsd", "netbsd", "openbsd":
		return "the rc.d script deploy/rc.d/drover_agent"
	}
	return "the systemd unit deploy/systemd/drover-agent.service or the rc.d script deploy/rc.d/drover_agent"
}

func connectServiceManager() (serviceManager, error) { return nil, errServiceUnsupported }

// RunAsWindowsService runs the agent under the Windows service control
// manager when it started it; elsewhere it returns ran false.
func RunAsWindowsService(_ []string, _ func(string) string, _ noderuntime.Registry) (code int, ran bool) {
	return 0, false
}
