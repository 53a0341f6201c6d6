package chaos

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// userProcsGrace bounds how long a finished session's processes may take to
// end: the gateway closing the node stream after the client closed its
// WebSocket, the agent's SIGHUP to the shell's process group, SIGKILL after
// the agent's 2 s kill grace, and reaping, on a loaded machine.
const userProcsGrace = 15 * time.Second

// userProcs lists the processes running as uid (real uid): "pid comm
// (ppid N): cmdline".
func userProcs(uid string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // exited meanwhile
		}
		var name, ppid, ruid string
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			f := strings.Fields(v)
			switch {
			case k == "Name":
				name = strings.TrimSpace(v)
			case k == "PPid":
				ppid = strings.TrimSpace(v)
			case k == "Uid" && len(f) > 0:
				ruid = f[0]
			}
		}
		if ruid != uid {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, fmt.Sprintf("%s %s (ppid %s): %s", e.Name(), name, ppid,
			strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))))
	}
	return out
}

// waitUserProcsGone waits until no process runs as the OS user name (a
// user with a live process cannot be removed), at most d; it logs what it
// waited for and fails naming the processes left.
func (c *cluster) waitUserProcsGone(name string, d time.Duration) {
	c.t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		c.t.Fatalf("look up %s: %v", name, err)
	}
	start := time.Now()
	first := userProcs(u.Uid)
	for {
		left := userProcs(u.Uid)
		if len(left) == 0 {
			if len(first) > 0 {
				c.t.Logf("%s's processes ended %s after the injection began: %s", name,
					time.Since(start).Round(time.Millisecond), strings.Join(first, "; "))
			}
			return
		}
		if time.Since(start) > d {
			c.t.Fatalf("processes of %s still running %s after the session ended (the agent hangs up and kills a finished session's shell): %s\nagent log:\n%s",
				name, d, strings.Join(left, "; "), c.agentTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
