//go:build linux

package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// netnsChildEnv marks the child InOwnNetNS starts and carries its payload.
const netnsChildEnv = "DROVER_TEST_NETNS_CHILD"

// InOwnNetNS runs the calling test again in a child process of the test
// binary, in a new network namespace (CLONE_NEWNET) with its loopback up,
// and reports whether this is that child. In the parent it calls payload
// (nil for none) for what the parent builds that the child needs, passes
// it on, runs
// the child for at most timeout (less when the test's own deadline is
// nearer), relays its output and verdict, and returns false: the test
// returns at once. In the child it returns payload and true.
//
// Everything the child does happens in the namespace as on a host (links,
// routes, nftables, taps, sockets) and nothing touches the host's
// network; the namespace is gone with the last process in it. Without
// root, or where namespaces cannot be made, the test is skipped (failed
// under CI=true).
func InOwnNetNS(t *testing.T, timeout time.Duration, payload func() string) (string, bool) {
	t.Helper()
	if v, ok := os.LookupEnv(netnsChildEnv); ok {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Fatalf("loopback in the test's network namespace: %v", err)
		}
		return v, true
	}
	if os.Geteuid() != 0 {
		SkipOrFail(t, "a network namespace needs root")
	}
	var p string
	if payload != nil {
		p = payload()
	}
	if d, ok := t.Deadline(); ok && time.Until(d) < timeout+30*time.Second {
		timeout = time.Until(d) - 30*time.Second
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v", "-test.timeout="+timeout.String())
	cmd.Dir, _ = filepath.Abs(".")
	cmd.Env = append(os.Environ(), netnsChildEnv+"="+p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace of its own:\n%s", out)
	switch {
	case err != nil && strings.Contains(err.Error(), "operation not permitted"):
		SkipOrFail(t, "cannot create a network namespace: %v", err)
	case err != nil:
		t.Fatalf("the test in its network namespace failed: %v", err)
	case strings.Contains(string(out), "--- SKIP"):
		SkipOrFail(t, "the test in its network namespace skipped (see its output)")
	case !strings.Contains(string(out), "PASS"):
		t.Fatal("the test in its network namespace did not pass")
	}
	return "", false
}
