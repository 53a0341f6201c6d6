package bench

import (
	"os/exec"
	"syscall"
)

// childAttrs kills the control-plane child if the harness dies.
func childAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
