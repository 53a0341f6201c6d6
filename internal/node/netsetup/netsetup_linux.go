//go:build linux

package netsetup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Manager networks the instances of one host. It is safe for concurrent
// use; leases are serialized by a mutex.
type Manager struct {
	cfg  Config
	net  network
	dns  []netip.Addr
	nsFd int // the namespace of Config.NetNSPath, -1 for the agent's own

	mu sync.Mutex
}

// New checks cfg and returns a Manager; it changes nothing on the host
// (the bridge and table are made by the first Attach).
func New(cfg Config) (*Manager, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if cfg.CIDR == "" {
		cfg.CIDR = DefaultCIDR
	}
	if cfg.Table == "" {
		cfg.Table = TableName
	}
	if err := cfg.Check(); err != nil {
		return nil, fail("", "config", err)
	}
	n, _ := parseNetwork(cfg.CIDR)
	dns, _ := parseDNS(cfg.DNS)
	if cfg.StateDir == "" {
		return nil, fail("", "config", errors.New("no state directory"))
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fail("", "state dir", err)
	}
	m := &Manager{cfg: cfg, net: n, dns: dns, nsFd: -1}
	if cfg.NetNSPath != "" {
		h, err := netns.GetFromPath(cfg.NetNSPath)
		if err != nil {
			return nil, fail("", "open network namespace", err)
		}
		m.nsFd = int(h)
	}
	return m, nil
}

// Close releases the namespace handle (leases stay).
func (m *Manager) Close() error {
	if m.nsFd >= 0 {
		err := unix.Close(m.nsFd)
		m.nsFd = -1
		return err
	}
	return nil
}

// do runs fn in the manager's network namespace: on a locked OS thread
// switched into it when Config.NetNSPath is set (tap creation and sysctls
// act on the calling thread's namespace).
func (m *Manager) do(fn func() error) error {
	if m.nsFd < 0 {
		return fn()
	}
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		return fmt.Errorf("current network namespace: %w", err)
	}
	defer func() { _ = orig.Close() }()
	if err := netns.Set(netns.NsHandle(m.nsFd)); err != nil {
		goruntime.UnlockOSThread()
		return fmt.Errorf("enter network namespace: %w", err)
	}
	defer func() {
		// A thread that cannot go back stays locked and dies with the goroutine.
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread()
		}
	}()
	return fn()
}

// Attach gives instance id its network: the bridge (made once), its
// address (kept across restarts), its tap enslaved to the bridge, NAT and
// the DNAT rules of fwds (replacing earlier ones). The lease is persisted
// before the tap is made, so a crash in between leaks nothing Reconcile
// does not find; a first Attach that fails frees its lease again (the
// caller has none to release), a restart's keeps it.
func (m *Manager) Attach(ctx context.Context, id string, fwds []Forward) (Lease, error) {
	if err := ctx.Err(); err != nil {
		return Lease{}, fail(id, "attach", err)
	}
	fwds, err := normForwards(fwds)
	if err != nil {
		return Lease{}, fail(id, "forwards", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	st, err := loadState(m.cfg.StateDir)
	if err != nil {
		return Lease{}, fail(id, "load leases", err)
	}
	for _, f := range fwds {
		if other := hostPortOwner(st, id, f); other != "" {
			return Lease{}, fail(id, "forwards", fmt.Errorf("host port %s/%d is forwarded to instance %s", f.Proto, f.HostPort, other))
		}
	}
	ip, err := allocate(st, m.net, id)
	if err != nil {
		return Lease{}, fail(id, "allocate address", err)
	}
	rec := leaseRec{IP: ip.String(), Tap: TapName(id), MAC: MACFor(id), Forwards: fwds}
	_, had := st.Leases[id]
	st.CIDR = m.net.prefix.String()
	st.Leases[id] = rec
	if err := saveState(m.cfg.StateDir, st); err != nil {
		return Lease{}, fail(id, "save leases", err)
	}
	err = m.do(func() error {
		if err := m.ensureBridge(id); err != nil {
			return err
		}
		if err := m.ensureTap(id, rec.Tap); err != nil {
			return err
		}
		if err := m.ensureTable(id); err != nil {
			return err
		}
		return m.setForwards(id, ip, fwds)
	})
	if err != nil {
		if !had {
			// A first Attach that failed takes back what it made: the
			// caller has no lease to release (a restart's keeps its own).
			m.rollback(id, rec.Tap)
		}
		return Lease{}, asFail(id, "enter namespace", err)
	}
	return leaseOf(id, rec, m.net, m.dns), nil
}

// EnsureNetwork makes the network without any instance on it: the
// bridge with the gateway address, up, IPv4 forwarding and the NAT base
// rules (masquerade of what leaves the CIDR), each kept when already
// there. The slice network uses it: its VMs' taps are made by the VM
// runtime and its addresses come from DHCP reservations, not from this
// package's leases. An existing Open vSwitch bridge (an OVS internal port)
// of that name is used as it is (addressed and set up, never created);
// the bridge this makes is a Linux bridge.
func (m *Manager) EnsureNetwork(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fail("", "ensure network", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.do(func() error {
		if err := m.ensureBridgeOf("", true); err != nil {
			return err
		}
		return m.ensureTable("")
	})
	if err != nil {
		return asFail("", "enter namespace", err)
	}
	return nil
}

// rollback frees a lease a failed first Attach saved, with whatever tap
// and rules it made (best effort: a tap or rule left behind has no lease
// now, so Reconcile deletes it at the next agent start).
func (m *Manager) rollback(id, tap string) {
	_ = m.teardown(id, tap)
	if st, err := loadState(m.cfg.StateDir); err == nil {
		delete(st.Leases, id)
		_ = saveState(m.cfg.StateDir, st)
	}
}

// asFail keeps a *runtime.Error as is and wraps anything else.
func asFail(id, step string, err error) error {
	var re *runtime.Error
	if errors.As(err, &re) {
		return err
	}
	return fail(id, step, err)
}

// Lease returns the persisted lease of id.
func (m *Manager) Lease(id string) (Lease, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, err := loadState(m.cfg.StateDir)
	if err != nil {
		return Lease{}, false, fail(id, "load leases", err)
	}
	r, ok := st.Leases[id]
	if !ok {
		return Lease{}, false, nil
	}
	return leaseOf(id, r, m.net, m.dns), true, nil
}

// Leases returns every persisted lease, by instance id.
func (m *Manager) Leases() ([]Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, err := loadState(m.cfg.StateDir)
	if err != nil {
		return nil, fail("", "load leases", err)
	}
	out := make([]Lease, 0, len(st.Leases))
	for id, r := range st.Leases {
		out = append(out, leaseOf(id, r, m.net, m.dns))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out, nil
}

// Release frees id's network: its tap, its rules and its address. An
// instance without a lease is fine.
func (m *Manager) Release(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, err := loadState(m.cfg.StateDir)
	if err != nil {
		return fail(id, "load leases", err)
	}
	if err := m.teardown(id, TapName(id)); err != nil {
		return err
	}
	if _, ok := st.Leases[id]; !ok {
		return nil
	}
	delete(st.Leases, id)
	if err := saveState(m.cfg.StateDir, st); err != nil {
		return fail(id, "save leases", err)
	}
	return nil
}

// teardown deletes an instance's tap and rules.
func (m *Manager) teardown(id, tap string) error {
	err := m.do(func() error {
		if err := deleteLink(tap); err != nil {
			return fail(id, "delete tap", err)
		}
		c, err := m.nftConn()
		if err != nil {
			return fail(id, "nft connect", err)
		}
		want := string(tag(id))
		if _, err := m.deleteRules(c, func(ud []byte) bool { return string(ud) == want }); err != nil {
			return fail(id, "nft delete rule", err)
		}
		return nil
	})
	if err != nil {
		return asFail(id, "enter namespace", err)
	}
	return nil
}

// Reconcile frees what a crash may have leaked: the leases of instances
// not in live (with their taps and rules), taps named TapPrefix… on no
// lease, and rules of the table whose instance has no lease. Live
// instances keep their leases; their next Attach re-creates a missing tap.
func (m *Manager) Reconcile(ctx context.Context, live []string) (ReconcileReport, error) {
	var rep ReconcileReport
	m.mu.Lock()
	defer m.mu.Unlock()
	st, err := loadState(m.cfg.StateDir)
	if err != nil {
		return rep, fail("", "load leases", err)
	}
	alive := map[string]bool{}
	for _, id := range live {
		alive[id] = true
	}
	ids := make([]string, 0, len(st.Leases))
	for id := range st.Leases {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if alive[id] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rep, fail(id, "reconcile", err)
		}
		if err := m.teardown(id, st.Leases[id].Tap); err != nil {
			return rep, err
		}
		delete(st.Leases, id)
		rep.Released = append(rep.Released, id)
	}
	if len(rep.Released) > 0 {
		if err := saveState(m.cfg.StateDir, st); err != nil {
			return rep, fail("", "save leases", err)
		}
	}
	owned := map[string]bool{}
	for _, r := range st.Leases {
		owned[r.Tap] = true
	}
	err = m.do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return fail("", "list links", err)
		}
		for _, l := range links {
			name := l.Attrs().Name
			if l.Type() != "tuntap" || !strings.HasPrefix(name, TapPrefix) || owned[name] {
				continue
			}
			if err := netlink.LinkDel(l); err != nil {
				return fail("", "delete tap", fmt.Errorf("%s: %w", name, err))
			}
			rep.TapsRemoved = append(rep.TapsRemoved, name)
		}
		c, err := m.nftConn()
		if err != nil {
			return fail("", "nft connect", err)
		}
		n, err := m.deleteRules(c, orphanRule(st, m.net.prefix.String()))
		if err != nil {
			return fail("", "nft delete rule", err)
		}
		rep.RulesFreed = n
		return nil
	})
	if err != nil {
		return rep, asFail("", "enter namespace", err)
	}
	return rep, nil
}

// ensureBridge makes the bridge with the gateway address, up, and turns on
// IPv4 forwarding.
func (m *Manager) ensureBridge(id string) error { return m.ensureBridgeOf(id, false) }

// ensureBridgeOf is ensureBridge; ovsOK also accepts an existing Open
// vSwitch device of the bridge's name.
func (m *Manager) ensureBridgeOf(id string, ovsOK bool) error {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fail(id, "look up bridge", err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = m.cfg.Bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fail(id, "create bridge", fmt.Errorf("%s: %w", m.cfg.Bridge, err))
		}
		if br, err = netlink.LinkByName(m.cfg.Bridge); err != nil {
			return fail(id, "create bridge", err)
		}
	}
	if br.Type() != "bridge" && (!ovsOK || br.Type() != "openvswitch") {
		return fail(id, "create bridge", fmt.Errorf("%s exists and is a %s, not a bridge", m.cfg.Bridge, br.Type()))
	}
	addr, err := netlink.ParseAddr(fmt.Sprintf("%s/%d", m.net.gateway, m.net.prefix.Bits()))
	if err != nil {
		return fail(id, "bridge address", err)
	}
	if err := netlink.AddrReplace(br, addr); err != nil {
		return fail(id, "bridge address", fmt.Errorf("%s on %s: %w", addr, m.cfg.Bridge, err))
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fail(id, "bridge up", err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return fail(id, "enable ip forwarding", err)
	}
	return nil
}

// ensureTap makes the persistent tap (multi-queue off, no packet info,
// vnet header: what QEMU and Firecracker open) and enslaves it, up.
func (m *Manager) ensureTap(id, name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fail(id, "look up tap", err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = name
		t := &netlink.Tuntap{LinkAttrs: la, Mode: netlink.TUNTAP_MODE_TAP,
			Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_ONE_QUEUE}
		if err := netlink.LinkAdd(t); err != nil {
			return fail(id, "add tap", fmt.Errorf("%s: %w", name, err))
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return fail(id, "add tap", err)
		}
	}
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fail(id, "look up bridge", err)
	}
	if err := netlink.LinkSetMaster(l, br); err != nil {
		return fail(id, "enslave tap", fmt.Errorf("%s to %s: %w", name, m.cfg.Bridge, err))
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fail(id, "tap up", err)
	}
	return nil
}

// deleteLink deletes a device; a missing one is fine.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(l)
}
