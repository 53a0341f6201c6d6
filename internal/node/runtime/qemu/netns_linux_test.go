package qemu

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/testutil"
)

// bridgeKit is what a microVM bridge test boots: the microvmtest kit and
// root filesystem, built by the parent (which has the module cache and
// tools at hand) and handed to the child.
type bridgeKit struct {
	Kernel, Initrd, QEMU, QEMUImg string
	Rootfs, RootfsSHA256          string
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
	v, child := testutil.InOwnNetNS(t, 8*time.Minute, func() string {
		// The parent builds: it has the module cache and tools at hand.
		kit := microvmtest.Build(t, "")
		rootfs := microvmtest.Rootfs(t, t.TempDir())
		sum, err := qemutest.FileSHA256(rootfs)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(bridgeKit{Kernel: kit.Kernel, Initrd: kit.Initrd, QEMU: kit.QEMU, QEMUImg: kit.QEMUImg,
			Rootfs: rootfs, RootfsSHA256: sum})
		return string(b)
	})
	if !child {
		return bridgeKit{}, false
	}
	var k bridgeKit
	if err := json.Unmarshal([]byte(v), &k); err != nil {
		t.Fatalf("the parent's kit: %v", err)
	}
	return k, true
}
