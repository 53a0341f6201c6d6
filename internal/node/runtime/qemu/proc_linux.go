package qemu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// supportedOS: New builds Runtimes here.
const supportedOS = true

// qmpNeedle is how the QMP socket path appears in QEMU's command line.
func qmpNeedle(qmpPath string) []byte { return []byte("path=" + qemuValue(qmpPath) + ",") }

// processAlive reports whether pid is a live (not zombie) process whose
// command line names qmpPath: a recycled pid fails the check.
func processAlive(pid int, qmpPath string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 { // a zombie has an empty cmdline
		return false
	}
	return bytes.Contains(b, qmpNeedle(qmpPath))
}

// killProcess sends SIGKILL to pid if it still is this instance's QEMU.
func killProcess(pid int, qmpPath string) error {
	if !processAlive(pid, qmpPath) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// scanQEMU lists the processes whose command line has a QMP socket under
// instDir: socket path → pids. Recover uses it to find duplicates and
// QEMUs whose instance directory is gone.
func scanQEMU(instDir string) map[string][]int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	prefix := "socket,id=qmp0,path=" + qemuValue(filepath.Clean(instDir)+"/")
	out := map[string][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for _, arg := range strings.Split(string(b), "\x00") {
			if !strings.HasPrefix(arg, prefix) {
				continue
			}
			rest := strings.TrimPrefix(arg, "socket,id=qmp0,path=")
			i := strings.Index(rest, ",server=")
			if i < 0 {
				continue
			}
			p := strings.ReplaceAll(rest[:i], ",,", ",")
			out[p] = append(out[p], pid)
		}
	}
	return out
}
