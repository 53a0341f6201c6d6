//go:build !linux

package firecracker

import (
	"os"
	"os/exec"
)

// supportedOS is false: Firecracker runs on Linux (KVM) only; New refuses
// to build a Runtime and Detect says so.
const supportedOS = false

type procKey struct{ flag, value string }

func processAlive(int, procKey) bool     { return false }
func killProcess(int, procKey) error     { return errUnsupportedOS }
func detachAttrs(*exec.Cmd)              {}
func scanProcs(string) map[procKey][]int { return nil }
func cloneFile(_, _ *os.File) bool       { return false }
func tapExists(string) bool              { return false }
func isTmpfs(string) bool                { return false }
