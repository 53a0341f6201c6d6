//go:build linux

package firecracker

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// supportedOS: New builds Runtimes here.
const supportedOS = true

// procKey is the argument pair that names an instance's process in its
// command line: --api-sock <host path> (direct) or --id <jail id> (jailed:
// the jailer execs firecracker with --id).
type procKey struct{ flag, value string }

func (k procKey) needle() []byte { return []byte("\x00" + k.flag + "\x00" + k.value + "\x00") }

// processAlive reports whether pid is a live (not zombie) process whose
// command line has k: a recycled pid fails the check.
func processAlive(pid int, k procKey) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return false
	}
	return bytes.Contains(append([]byte{0}, b...), k.needle())
}

// killProcess sends SIGKILL to pid if it still is the instance's process.
func killProcess(pid int, k procKey) error {
	if !processAlive(pid, k) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// detachAttrs makes a spawned process its own session, so it outlives the
// agent (and the agent's process group signals).
func detachAttrs(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} }

// scanProcs lists the live processes whose command line has --api-sock
// under instDir or a --id: key → pids (Recover finds duplicates and
// orphans with it).
func scanProcs(instDir string) map[procKey][]int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	prefix := strings.TrimSuffix(instDir, "/") + "/"
	out := map[procKey][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		for i := 0; i+1 < len(args); i++ {
			switch {
			case args[i] == "--api-sock" && strings.HasPrefix(args[i+1], prefix):
				k := procKey{"--api-sock", args[i+1]}
				out[k] = append(out[k], pid)
			case args[i] == "--id" && i > 0:
				k := procKey{"--id", args[i+1]}
				out[k] = append(out[k], pid)
			}
		}
	}
	return out
}

// cloneFile makes dst a reflink of src (FICLONE) where the filesystem can.
func cloneFile(dst, src *os.File) bool {
	return unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil
}

// tapExists reports whether the network device name exists.
func tapExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}

// isTmpfs reports whether dir is on a tmpfs (memory only: what a config
// drive with secrets is written to).
func isTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}
