package slicedhcp

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
	"github.com/vishvananda/netlink"
)

// Names of the test's slice network (inside its namespace).
const (
	testBridge = "brs0"
	testPort   = "vs0" // the veth end on the bridge
	testClient = "vc0" // the veth end udhcpc runs on
)

var testSubnet = netip.MustParsePrefix("10.77.0.0/24")

// slicenet makes, in the current namespace, the slice bridge with the
// gateway address and a veth pair with one end on it.
func slicenet(t *testing.T) {
	t.Helper()
	la := netlink.NewLinkAttrs()
	la.Name = testBridge
	br := &netlink.Bridge{LinkAttrs: la}
	must(t, netlink.LinkAdd(br))
	addr, err := netlink.ParseAddr("10.77.0.1/24")
	must(t, err)
	must(t, netlink.AddrAdd(br, addr))
	must(t, netlink.LinkSetUp(br))
	va := netlink.NewLinkAttrs()
	va.Name = testPort
	must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: va, PeerName: testClient}))
	port, err := netlink.LinkByName(testPort)
	must(t, err)
	must(t, netlink.LinkSetMaster(port, br))
	must(t, netlink.LinkSetUp(port))
	for _, n := range []string{"lo", testClient} {
		l, err := netlink.LinkByName(n)
		must(t, err)
		must(t, netlink.LinkSetUp(l))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// dhcpClient runs busybox udhcpc on the client veth with mac and returns
// what its script recorded for the lease, or nil when it got none.
type dhcpClient struct {
	busybox, script, dir string
}

func newClient(t *testing.T) *dhcpClient {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		testutil.SkipOrFail(t, "busybox (busybox-static) is not installed: %v", err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "lease.sh")
	// udhcpc runs the script with "bound" and the lease in its environment.
	writeTestFile(t, script, "#!/bin/sh\nif [ \"$1\" = bound ]; then env > \"$LEASE_FILE.tmp\" && mv \"$LEASE_FILE.tmp\" \"$LEASE_FILE\"; fi\nexit 0\n", 0o755)
	return &dhcpClient{busybox: bb, script: script, dir: dir}
}

// lease asks for a lease as mac; tries bounds the DISCOVERs (2s apart).
func (c *dhcpClient) lease(t *testing.T, mac string, tries int) map[string]string {
	t.Helper()
	l, err := netlink.LinkByName(testClient)
	must(t, err)
	hw, err := net.ParseMAC(mac)
	must(t, err)
	must(t, netlink.LinkSetDown(l))
	must(t, netlink.LinkSetHardwareAddr(l, hw))
	must(t, netlink.LinkSetUp(l))
	file := filepath.Join(c.dir, "lease-"+strings.ReplaceAll(mac, ":", ""))
	_ = os.Remove(file)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.busybox, "udhcpc", "-f", "-q", "-n", "-i", testClient, "-s", c.script,
		"-t", strconv.Itoa(tries), "-T", "2", "-A", "1")
	cmd.Env = append(os.Environ(), "LEASE_FILE="+file)
	out, err := cmd.CombinedOutput()
	t.Logf("udhcpc as %s: %v\n%s", mac, err, out)
	b, rerr := os.ReadFile(file)
	if errors.Is(rerr, os.ErrNotExist) {
		if err == nil {
			t.Fatalf("udhcpc exited 0 but its script recorded no lease")
		}
		return nil
	}
	must(t, rerr)
	env := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env
}

// startServer serves store on the test bridge until the returned stop.
func startServer(t *testing.T, store *Store) (stop func()) {
	t.Helper()
	srv, err := NewServer(Config{Interface: testBridge, Subnet: testSubnet,
		DNS: []netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("1.1.1.1")}, LeaseTime: 10 * time.Minute}, store)
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done, err := srv.Start(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("server: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("server did not stop")
		}
	}
}

func reserve(t *testing.T, st *Store, vm, mac, ip string) {
	t.Helper()
	r, err := NewReservation(mac, ip, vm)
	must(t, err)
	if _, err := st.Reserve(vm, []Reservation{r}); err != nil {
		t.Fatal(err)
	}
}

const (
	macA = "52:54:00:aa:00:01"
	macB = "52:54:00:bb:00:02"
	macX = "52:54:00:ee:ee:ee" // never reserved
)

// TestServerRealClient: busybox udhcpc, on a veth whose other end is on
// the slice bridge, gets exactly its reservation (address, mask, gateway,
// resolvers, lease time, hostname); an unknown MAC gets no offer; an
// agent restart (a new Store from the same directory, a new server)
// serves the reservations again; a dropped reservation (release) and a
// pruned one (a VM gone after a crash) are answered no more.
func TestServerRealClient(t *testing.T) {
	if _, child := testutil.InOwnNetNS(t, 4*time.Minute, nil); !child {
		return
	}
	client := newClient(t)
	slicenet(t)
	dir := filepath.Join(t.TempDir(), "dhcp-hosts.d")
	st, err := OpenStore(dir, testSubnet)
	must(t, err)
	reserve(t, st, "slice-a", macA, "10.77.0.10")
	stop := startServer(t, st)

	t.Run("reserved mac gets its address", func(t *testing.T) {
		got := client.lease(t, macA, 5)
		want := map[string]string{"ip": "10.77.0.10", "subnet": "255.255.255.0", "router": "10.77.0.1",
			"dns": "10.77.0.1 1.1.1.1", "lease": "600", "hostname": "slice-a", "serverid": "10.77.0.1"}
		if got == nil {
			t.Fatal("no lease")
		}
		for k, v := range want {
			if strings.TrimSpace(got[k]) != v {
				t.Errorf("%s = %q, want %q", k, got[k], v)
			}
		}
	})
	t.Run("unknown mac gets no offer", func(t *testing.T) {
		if got := client.lease(t, macX, 3); got != nil {
			t.Fatalf("unknown mac got a lease: %v", got)
		}
	})

	stop()
	st, err = OpenStore(dir, testSubnet) // the agent starting again
	must(t, err)
	stop = startServer(t, st)
	defer func() { stop() }()
	t.Run("restart restores the reservation", func(t *testing.T) {
		if got := client.lease(t, macA, 5); got["ip"] != "10.77.0.10" {
			t.Fatalf("after restart: lease %v, want 10.77.0.10", got)
		}
	})
	t.Run("release drops the reservation", func(t *testing.T) {
		if had, err := st.Drop("slice-a"); err != nil || !had {
			t.Fatalf("drop: %v %v", had, err)
		}
		if got := client.lease(t, macA, 3); got != nil {
			t.Fatalf("released mac got a lease: %v", got)
		}
	})
	t.Run("prune drops the reservations of gone vms", func(t *testing.T) {
		reserve(t, st, "slice-a", macA, "10.77.0.10")
		reserve(t, st, "slice-b", macB, "10.77.0.11")
		stop()
		st, err = OpenStore(dir, testSubnet)
		must(t, err)
		dropped, err := st.Prune(func(vm string) bool { return vm == "slice-b" })
		must(t, err)
		if strings.Join(dropped, ",") != "slice-a" {
			t.Fatalf("pruned %v, want [slice-a]", dropped)
		}
		stop = startServer(t, st)
		if got := client.lease(t, macA, 3); got != nil {
			t.Fatalf("the gone vm's mac got a lease: %v", got)
		}
		if got := client.lease(t, macB, 5); got["ip"] != "10.77.0.11" {
			t.Fatalf("the live vm's lease %v, want 10.77.0.11", got)
		}
	})
}
