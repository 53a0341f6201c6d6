//go:build linux

package netsetup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// newNS makes an unnamed network namespace (gone once its handle closes)
// with lo up, and returns its handle.
func newNS(t *testing.T) netns.NsHandle {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "network namespaces need root")
	}
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		goruntime.UnlockOSThread()
		testutil.SkipOrFail(t, "create network namespace: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to the test's namespace: %v", err) // thread stays locked
	}
	goruntime.UnlockOSThread()
	t.Cleanup(func() { _ = ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	return ns
}

func nsPath(ns netns.NsHandle) string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns)) }

// newManager builds a Manager inside a fresh namespace; a kernel without
// nftables skips (fails under CI).
func newManager(t *testing.T) (*Manager, netns.NsHandle, string) {
	t.Helper()
	ns := newNS(t)
	dir := t.TempDir()
	m, err := New(Config{Bridge: "drbrt0", CIDR: "10.99.0.0/24", StateDir: dir, NetNSPath: nsPath(ns)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, ns, dir
}

func attach(t *testing.T, m *Manager, id string, fwds ...Forward) Lease {
	t.Helper()
	l, err := m.Attach(context.Background(), id, fwds)
	if err != nil && strings.Contains(err.Error(), "nft ") {
		testutil.SkipOrFail(t, "nftables unavailable: %v", err)
	}
	if err != nil {
		t.Fatalf("attach %s: %v", id, err)
	}
	return l
}

func linkIn(t *testing.T, ns netns.NsHandle, name string) netlink.Link {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return nil
	}
	return l
}

func TestAttachRelease(t *testing.T) {
	m, ns, dir := newManager(t)
	a := attach(t, m, "web-a", Forward{HostPort: 8080, GuestPort: 80})
	b := attach(t, m, "web-b")
	if a.IP != netip.MustParseAddr("10.99.0.2") || b.IP != netip.MustParseAddr("10.99.0.3") {
		t.Fatalf("addresses %s %s, want .2 .3", a.IP, b.IP)
	}
	if a.Gateway != netip.MustParseAddr("10.99.0.1") || a.Prefix != 24 || a.Tap != TapName("web-a") {
		t.Fatalf("lease %+v", a)
	}
	if got := a.KernelIPArg(); got != "ip=10.99.0.2::10.99.0.1:255.255.255.0::eth0:off:1.1.1.1" {
		t.Fatalf("kernel arg %q", got)
	}
	br := linkIn(t, ns, "drbrt0")
	if br == nil || br.Type() != "bridge" {
		t.Fatalf("bridge: %v", br)
	}
	for _, l := range []Lease{a, b} {
		tap := linkIn(t, ns, l.Tap)
		if tap == nil || tap.Type() != "tuntap" || tap.Attrs().MasterIndex != br.Attrs().Index {
			t.Fatalf("tap %s: %v", l.Tap, tap)
		}
	}
	if linkIn(t, netns.None(), a.Tap) != nil {
		t.Fatal("tap leaked into the test's own namespace")
	}
	tags, err := m.RuleTags()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"prerouting: drover:inst:web-a", "output: drover:inst:web-a",
		"postrouting: drover:base:10.99.0.0/24", "postrouting: drover:base:10.99.0.0/24"}
	if !sameSet(tags, want) {
		t.Fatalf("rules %q, want %q", tags, want)
	}
	// A restart keeps the address; the forwards are replaced.
	again := attach(t, m, "web-a", Forward{HostPort: 8081, GuestPort: 80}, Forward{Proto: "udp", HostPort: 5353, GuestPort: 53})
	if again.IP != a.IP {
		t.Fatalf("restart moved %s to %s", a.IP, again.IP)
	}
	if tags, _ = m.RuleTags(); count(tags, "drover:inst:web-a") != 4 {
		t.Fatalf("rules after re-attach: %q", tags)
	}
	// A host port another instance forwards is refused.
	if _, err := m.Attach(context.Background(), "web-b", []Forward{{HostPort: 8081, GuestPort: 1}}); !isNetErr(err, "forwards") {
		t.Fatalf("duplicate host port: %v", err)
	}

	if err := m.Release(context.Background(), "web-a"); err != nil {
		t.Fatal(err)
	}
	if linkIn(t, ns, a.Tap) != nil {
		t.Fatal("tap of web-a still there")
	}
	if tags, _ = m.RuleTags(); count(tags, "drover:inst:web-a") != 0 || count(tags, "drover:base:") != 2 {
		t.Fatalf("rules after release: %q", tags)
	}
	st, err := loadState(dir)
	if err != nil || len(st.Leases) != 1 || st.Leases["web-b"].IP != "10.99.0.3" {
		t.Fatalf("state after release: %+v %v", st, err)
	}
	if c := attach(t, m, "web-c"); c.IP != a.IP {
		t.Fatalf("freed address not reused: %s", c.IP)
	}
	if err := m.Release(context.Background(), "never-attached"); err != nil {
		t.Fatal(err)
	}
}

func TestReconcileAfterCrash(t *testing.T) {
	m, ns, dir := newManager(t)
	a := attach(t, m, "live-a", Forward{HostPort: 9000, GuestPort: 90})
	attach(t, m, "dead-b", Forward{HostPort: 9001, GuestPort: 90})
	ghost := attach(t, m, "ghost", Forward{HostPort: 9002, GuestPort: 90})
	// Crash: live-a's tap vanished (state says allocated, tap missing);
	// ghost's lease was lost (tap and rules present, state missing).
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkDel(linkIn(t, ns, a.Tap)); err != nil {
		t.Fatal(err)
	}
	st, _ := loadState(dir)
	delete(st.Leases, "ghost")
	if err := saveState(dir, st); err != nil {
		t.Fatal(err)
	}

	rep, err := m.Reconcile(context.Background(), []string{"live-a"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Released, []string{"dead-b"}) || !slices.Equal(rep.TapsRemoved, []string{ghost.Tap}) || rep.RulesFreed != 2 {
		t.Fatalf("report %+v", rep)
	}
	for _, tap := range []string{TapName("dead-b"), ghost.Tap} {
		if linkIn(t, ns, tap) != nil {
			t.Fatalf("tap %s left", tap)
		}
	}
	tags, _ := m.RuleTags()
	if count(tags, "drover:inst:") != 2 || count(tags, "drover:inst:live-a") != 2 {
		t.Fatalf("rules after reconcile: %q", tags)
	}
	if leases, _ := m.Leases(); len(leases) != 1 || leases[0].InstanceID != "live-a" {
		t.Fatalf("leases %+v", leases)
	}
	// The live instance's next Attach brings its tap back, same address.
	if again := attach(t, m, "live-a", Forward{HostPort: 9000, GuestPort: 90}); again.IP != a.IP || linkIn(t, ns, a.Tap) == nil {
		t.Fatalf("re-attach: %+v", again)
	}
}

func TestErrorsNameTheStep(t *testing.T) {
	m, _, _ := newManager(t)
	_, err := m.Attach(context.Background(), "x", []Forward{{Proto: "sctp", HostPort: 1, GuestPort: 1}})
	if !isNetErr(err, "forwards") {
		t.Fatalf("bad forward: %v", err)
	}
	// A veth under the bridge's name fails at "create bridge".
	ns := newNS(t)
	h, _ := netlink.NewHandleAt(ns)
	defer h.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "drbrt1"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "drbrt1p"}); err != nil {
		t.Fatal(err)
	}
	m2, err := New(Config{Bridge: "drbrt1", CIDR: "10.98.0.0/24", StateDir: t.TempDir(), NetNSPath: nsPath(ns)})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if _, err := m2.Attach(context.Background(), "y", nil); !isNetErr(err, "create bridge") {
		t.Fatalf("veth as bridge: %v", err)
	}
	// The failed first Attach took its lease back: nobody would release it.
	if leases, err := m2.Leases(); err != nil || len(leases) != 0 {
		t.Fatalf("leases after a failed attach: %+v %v", leases, err)
	}
	if _, err := New(Config{CIDR: "10.0.0.0/30x", StateDir: t.TempDir()}); !isNetErr(err, "config") {
		t.Fatalf("bad cidr: %v", err)
	}
}

func isNetErr(err error, step string) bool {
	var re *runtime.Error
	return errors.As(err, &re) && re.Reason == api.ReasonNetworkSetupFailed && strings.HasPrefix(re.Err.Error(), step+":")
}

func count(list []string, sub string) int {
	n := 0
	for _, s := range list {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// inNS runs fn on a thread inside ns.
func inNS(t *testing.T, ns netns.NsHandle, fn func()) {
	t.Helper()
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := netns.Set(orig); err != nil {
		t.Fatal(err) // thread stays locked and dies
	}
	goruntime.UnlockOSThread()
}

// vethInstance plays an instance: a namespace wired to the bridge by a
// veth pair, configured with the lease.
func vethInstance(t *testing.T, host netns.NsHandle, bridge string, l Lease, n int) netns.NsHandle {
	t.Helper()
	inst := newNS(t)
	h, err := netlink.NewHandleAt(host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	la := netlink.NewLinkAttrs()
	la.Name = fmt.Sprintf("dvtest%d", n)
	br, err := h.LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	la.MasterIndex = br.Attrs().Index
	peer := fmt.Sprintf("dvpeer%d", n)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: peer}); err != nil {
		t.Fatal(err)
	}
	hostEnd, _ := h.LinkByName(la.Name)
	if err := h.LinkSetUp(hostEnd); err != nil {
		t.Fatal(err)
	}
	p, err := h.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetNsFd(p, int(inst)); err != nil {
		t.Fatal(err)
	}
	ih, err := netlink.NewHandleAt(inst)
	if err != nil {
		t.Fatal(err)
	}
	defer ih.Close()
	p, err = ih.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(fmt.Sprintf("%s/%d", l.IP, l.Prefix))
	if err := ih.AddrAdd(p, addr); err != nil {
		t.Fatal(err)
	}
	if err := ih.LinkSetUp(p); err != nil {
		t.Fatal(err)
	}
	if err := ih.RouteAdd(&netlink.Route{LinkIndex: p.Attrs().Index, Gw: net.IP(l.Gateway.AsSlice())}); err != nil {
		t.Fatal(err)
	}
	return inst
}

// TestForwardCarriesTraffic: a DNAT forward reaches a veth-backed
// instance from another instance (hairpin) and from the host itself.
func TestForwardCarriesTraffic(t *testing.T) {
	m, host, _ := newManager(t)
	a := attach(t, m, "srv", Forward{HostPort: 18080, GuestPort: 8080})
	b := attach(t, m, "cli")
	srvNS := vethInstance(t, host, "drbrt0", a, 1)
	cliNS := vethInstance(t, host, "drbrt0", b, 2)

	var ln net.Listener
	inNS(t, srvNS, func() {
		var err error
		if ln, err = net.Listen("tcp", fmt.Sprintf("%s:8080", a.IP)); err != nil {
			t.Fatal(err)
		}
	})
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintf(c, "hello from srv to %s\n", c.RemoteAddr().(*net.TCPAddr).IP)
			_ = c.Close()
		}
	}()
	dial := func(ns netns.NsHandle, who string) string {
		var c net.Conn
		inNS(t, ns, func() {
			var err error
			if c, err = net.DialTimeout("tcp", fmt.Sprintf("%s:18080", a.Gateway), 5*time.Second); err != nil {
				t.Fatalf("%s dial: %v", who, err)
			}
		})
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("%s read: %v", who, err)
		}
		return string(b)
	}
	// Instance to instance through the forward: masqueraded to the gateway.
	if got := dial(cliNS, "instance"); got != "hello from srv to 10.99.0.1\n" {
		t.Fatalf("instance → forward: %q", got)
	}
	// From the host's own namespace (output chain).
	if got := dial(host, "host"); !strings.HasPrefix(got, "hello from srv") {
		t.Fatalf("host → forward: %q", got)
	}
	// Released: the forward is gone.
	if err := m.Release(context.Background(), "srv"); err != nil {
		t.Fatal(err)
	}
	inNS(t, cliNS, func() {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("%s:18080", a.Gateway), time.Second)
		if err == nil {
			c.Close()
			t.Fatal("forward still carries traffic after release")
		}
	})
}
