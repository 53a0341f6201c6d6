package slicedhcp

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/vishvananda/netlink"
)

// guestNetModules load, in this order, before eth0 exists.
var guestNetModules = []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev",
	"virtio_pci", "failover", "net_failover", "virtio_net"}

// TestGuestGetsAddressByDHCP boots the qemutest guest under TCG with a
// virtio NIC (the slot's MAC) on a tap on the slice bridge, in a network
// namespace of the test's own; the guest's busybox udhcpc gets the
// reserved address from the agent's server.
func TestGuestGetsAddressByDHCP(t *testing.T) {
	if _, child := testutil.InOwnNetNS(t, 4*time.Minute, nil); !child {
		return
	}
	g := qemutest.Build(t, "")
	if !g.CanNetwork {
		testutil.SkipOrFail(t, "the test kernel has no virtio-net modules")
	}
	slicenet(t)
	st, err := OpenStore(filepath.Join(t.TempDir(), "dhcp-hosts.d"), testSubnet)
	must(t, err)
	reserve(t, st, "slice-g", macA, "10.77.0.10")
	stop := startServer(t, st)
	defer stop()

	br, err := netlink.LinkByName(testBridge)
	must(t, err)
	la := netlink.NewLinkAttrs()
	la.Name = "tapg0"
	must(t, netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: la, Mode: netlink.TUNTAP_MODE_TAP,
		Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_ONE_QUEUE}))
	tap, err := netlink.LinkByName("tapg0")
	must(t, err)
	must(t, netlink.LinkSetMaster(tap, br))
	must(t, netlink.LinkSetUp(tap))

	// The guest's init is a shell line (no '=': the kernel would split
	// the argument there): load virtio-net, ask for a lease, power off.
	var script strings.Builder
	for _, m := range guestNetModules {
		script.WriteString("insmod /lib/modules/" + m + ".ko; ")
	}
	script.WriteString("ifconfig eth0 up; busybox udhcpc -i eth0 -f -q -n -t 10 -T 3 -s /bin/false && echo DHCP-GUEST-BOUND || echo DHCP-GUEST-FAILED; poweroff -f")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.QEMU, "-machine", "q35", "-accel", "tcg", "-m", "256", "-nodefaults",
		"-no-reboot", "-display", "none", "-serial", "stdio",
		"-kernel", g.Kernel, "-initrd", g.Initrd,
		"-append", `console=ttyS0 quiet panic=-1 rdinit=/bin/sh -- -c "`+script.String()+`"`,
		"-netdev", "tap,id=n0,ifname=tapg0,script=no,downscript=no,vhost=off",
		"-device", "virtio-net-pci,netdev=n0,mac="+macA)
	out, err := cmd.CombinedOutput()
	t.Logf("guest console (%v):\n%s", err, out)
	if ctx.Err() != nil {
		t.Fatal("the guest did not power off within 5 minutes")
	}
	if !strings.Contains(string(out), "DHCP-GUEST-BOUND") || !strings.Contains(string(out), "lease of 10.77.0.10 obtained from 10.77.0.1") {
		t.Fatalf("the guest did not get its reserved address")
	}
}
