package qemu

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/vishvananda/netlink"
)

// netnsChildEnv carries a bridgeKit from a test to its copy running in a
// network namespace of its own.
const netnsChildEnv = "DROVER_TEST_QEMU_NETNS_CHILD"

// bridgeKit is what a microVM bridge test boots: the microvmtest kit and
// root filesystem, built by the parent (which has the module cache and
// tools at hand) and handed to the child.
type bridgeKit struct {
	Kernel, Initrd, QEMU, QEMUImg string
	Rootfs, RootfsSHA256          string
}

// skipOrFail skips a test that lacks a capability, or fails it under CI=true.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// inOwnNetNS runs the calling test again in a child process of the test
// binary, in a new network namespace (CLONE_NEWNET) with lo up, and
// reports whether this is that child. In the parent it builds the kit,
// runs the child, relays its output and verdict, and returns false: the
// test returns at once. In the child it returns the kit and true.
//
// The whole child lives in the namespace, so everything the agent does
// happens there as on a host: netsetup's netlink and nftables calls, QEMU
// opening its tap by name (the tap must be in QEMU's own namespace), the
// readiness probe and the test's dials through the bridge. Nothing
// touches the host's network, and the namespace is gone with the last
// process in it.
func inOwnNetNS(t *testing.T) (bridgeKit, bool) {
	t.Helper()
	if v := os.Getenv(netnsChildEnv); v != "" {
		var k bridgeKit
		if err := json.Unmarshal([]byte(v), &k); err != nil {
			t.Fatalf("%s: %v", netnsChildEnv, err)
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			t.Fatal(err)
		}
		return k, true
	}
	if os.Geteuid() != 0 {
		skipOrFail(t, "a network namespace, a bridge and taps need root")
	}
	kit := microvmtest.Build(t, "")
	dir := t.TempDir()
	rootfs := microvmtest.Rootfs(t, dir)
	sum, err := qemutest.FileSHA256(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(bridgeKit{Kernel: kit.Kernel, Initrd: kit.Initrd, QEMU: kit.QEMU, QEMUImg: kit.QEMUImg,
		Rootfs: rootfs, RootfsSHA256: sum})
	timeout := 8 * time.Minute
	if d, ok := t.Deadline(); ok && time.Until(d) < timeout+30*time.Second {
		timeout = time.Until(d) - 30*time.Second
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v", "-test.timeout="+timeout.String())
	cmd.Dir, _ = filepath.Abs(".")
	cmd.Env = append(os.Environ(), netnsChildEnv+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace of its own:\n%s", out)
	switch {
	case err != nil && strings.Contains(err.Error(), "operation not permitted"):
		skipOrFail(t, "cannot create a network namespace: %v", err)
	case err != nil:
		t.Fatalf("the test in its network namespace failed: %v", err)
	case strings.Contains(string(out), "--- SKIP"):
		skipOrFail(t, "the test in its network namespace skipped (see its output)")
	case !strings.Contains(string(out), "PASS"):
		t.Fatalf("the test in its network namespace did not pass")
	}
	return bridgeKit{}, false
}
