//go:build unix && !linux

package qemu

import (
	"errors"
	"syscall"
)

// supportedOS: New builds Runtimes here.
const supportedOS = true

// processAlive reports whether pid is alive. Without /proc the command line
// cannot be checked, so a recycled pid passes; the pid file is removed
// whenever the instance is seen to exit, which keeps that window small.
func processAlive(pid int, _ string) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killProcess sends SIGKILL to pid if it is alive.
func killProcess(pid int, qmpPath string) error {
	if !processAlive(pid, qmpPath) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// scanQEMU needs /proc: nothing is found here.
func scanQEMU(string) map[string][]int { return nil }
