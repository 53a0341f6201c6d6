// Package netsetup gives microVMs a network on a Linux host: one bridge per
// host with the gateway address of a per-host CIDR, a tap device per
// instance enslaved to it, an IPv4 address per instance from that CIDR,
// NAT (masquerade) for traffic leaving the CIDR and DNAT port forwards
// (host port → instance IP:port), all through netlink
// (github.com/vishvananda/netlink) and nftables (github.com/google/nftables);
// it never runs `ip` or `nft`.
//
// Use:
//
//	m, err := netsetup.New(netsetup.Config{Bridge: "drbr0", CIDR: "10.88.0.0/24", StateDir: dir})
//	_, err = m.Reconcile(ctx, liveIDs)          // at agent start: frees leaks of a crash
//	lease, err := m.Attach(ctx, id, forwards)    // before the VMM starts: tap exists, rules in place
//	//   lease.Tap        → QEMU "-netdev tap,ifname=…" / Firecracker host_dev_name
//	//   lease.MAC        → the guest NIC's MAC
//	//   lease.KernelIPArg() or lease.IP/Prefix/Gateway/DNS → the guest's configuration
//	err = m.Release(ctx, id)                    // on destroy: tap, rules and address freed
//
// Attach is idempotent: a second Attach of the same instance (a restart)
// keeps its address, re-creates a missing tap and replaces its forwards.
// Leases live in <StateDir>/ipam.json, replaced atomically; Reconcile
// releases the leases of instances that no longer exist and deletes taps
// and nftables rules that no lease owns.
//
// EnsureNetwork makes a network with no instance on it (the bridge with
// its gateway address and the NAT base rules): the slice network of GPU
// slice VMs, whose taps the VM runtime makes and whose addresses come
// from DHCP reservations (internal/node/slicedhcp), runs on a second
// Manager with Config.Table "drover_slice".
//
// nftables: Drover owns the table "ip drover" (created idempotently) with
// nat chains prerouting, output and postrouting. Base rules (masquerade of
// the CIDR, hairpin NAT between instances) carry the user data
// "drover:base:<cidr>", each forward "drover:inst:<id>", so Release removes
// exactly an instance's rules. Other tables (a host firewall whose forward
// chain drops, Docker's) are not touched; see docs/runbooks/microvms.md.
//
// Every failure is a *runtime.Error with reason network_setup_failed whose
// message starts with the failing step ("create bridge", "add tap",
// "nft add rule", ...). Outside Linux, New fails with "not supported on this
// platform".
package netsetup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/node/atomicfile"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Defaults of the agent keys NODE_AGENT_MICROVM_BRIDGE,
// NODE_AGENT_MICROVM_CIDR and NODE_AGENT_MICROVM_DNS.
const (
	DefaultBridge = "drbr0"
	DefaultCIDR   = "10.88.0.0/24"
	DefaultDNS    = "1.1.1.1"
)

// TableName is the nftables table (family ip) Drover owns.
const TableName = "drover"

// TapPrefix starts the name of every tap device this package creates.
const TapPrefix = "dv"

// stateFile is the lease file under Config.StateDir.
const stateFile = "ipam.json"

// ErrUnsupported is returned by New outside Linux.
var ErrUnsupported = errors.New("microVM networking (netsetup) is not supported on this platform")

// Config says where and how instances are networked.
type Config struct {
	Bridge   string   // bridge device (default DefaultBridge)
	CIDR     string   // per-host IPv4 CIDR; the first host address is the gateway (default DefaultCIDR)
	StateDir string   // required: ipam.json lives here
	DNS      []string // resolvers given to guests (default DefaultDNS: the host's upstream is not known)
	// NetNSPath, when set, makes every operation happen inside that
	// network namespace (tests build their own: traffic stays inside it).
	NetNSPath string
	// Table is the nftables table (family ip) of this network's rules
	// (default TableName). A second network on the host (the slice
	// network) takes a table of its own, so that neither's Reconcile
	// deletes the other's base rules.
	Table string
}

// Check validates the bridge name, the CIDR and the resolvers (an empty
// one stands for its default); New runs it, the agent runs it on its
// configuration. It changes nothing and works on every platform.
func (c Config) Check() error {
	if c.Bridge != "" && (len(c.Bridge) > 15 || strings.ContainsAny(c.Bridge, "/ \t")) {
		return fmt.Errorf("bridge name %q: 1-15 characters, no '/' or spaces", c.Bridge)
	}
	if c.CIDR != "" {
		if _, err := parseNetwork(c.CIDR); err != nil {
			return err
		}
	}
	if c.Table != "" && (len(c.Table) > 32 || strings.Trim(c.Table, "abcdefghijklmnopqrstuvwxyz0123456789_") != "") {
		return fmt.Errorf("nftables table %q: 1-32 characters of a-z, 0-9 and _", c.Table)
	}
	_, err := parseDNS(c.DNS)
	return err
}

// Forward is a DNAT port forward: traffic to any host address on HostPort
// goes to the instance's address on GuestPort.
type Forward struct {
	Proto     string `json:"proto"` // "tcp" (default) or "udp"
	HostPort  int    `json:"host_port"`
	GuestPort int    `json:"guest_port"`
}

// Lease is an instance's network: its tap, its guest NIC's MAC and the
// configuration the guest needs.
type Lease struct {
	InstanceID string
	Tap        string
	MAC        string
	IP         netip.Addr
	Gateway    netip.Addr
	Prefix     int
	DNS        []netip.Addr
	Forwards   []Forward
}

// Netmask is the prefix as a dotted mask ("255.255.255.0").
func (l Lease) Netmask() string {
	return net.IP(net.CIDRMask(l.Prefix, 32)).String()
}

// KernelIPArg is the kernel command line parameter that configures the
// guest's first NIC (eth0) statically, in the form of the kernel's
// Documentation/admin-guide/nfs/nfsroot.rst:
// ip=<client>::<gw>:<netmask>::eth0:off[:<dns0>[:<dns1>]].
func (l Lease) KernelIPArg() string {
	s := fmt.Sprintf("ip=%s::%s:%s::eth0:off", l.IP, l.Gateway, l.Netmask())
	for i, d := range l.DNS {
		if i == 2 {
			break
		}
		s += ":" + d.String()
	}
	return s
}

// ReconcileReport says what Reconcile cleaned up.
type ReconcileReport struct {
	Released    []string // instance ids whose leases were freed
	TapsRemoved []string // orphan tap devices deleted
	RulesFreed  int      // orphan nftables rules deleted
}

// TapName is the tap device of an instance: TapPrefix and 13 hex digits of
// a hash of its id (IFNAMSIZ allows 15).
func TapName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return TapPrefix + hex.EncodeToString(sum[:])[:13]
}

// MACFor is the guest NIC's MAC of an instance: locally administered,
// unicast, derived from its id.
func MACFor(id string) string {
	sum := sha256.Sum256([]byte("mac:" + id))
	return fmt.Sprintf("02:d5:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3])
}

// fail builds the package's error: network_setup_failed naming step.
func fail(id, step string, err error) error {
	return runtime.Errorf(api.ReasonNetworkSetupFailed, "network", id, "%s: %w", step, err)
}

// network is the parsed CIDR with its gateway.
type network struct {
	prefix  netip.Prefix
	gateway netip.Addr
}

func parseNetwork(cidr string) (network, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return network{}, fmt.Errorf("cidr %q: %w", cidr, err)
	}
	p = p.Masked()
	if !p.Addr().Is4() || p.Bits() > 29 || p.Bits() < 8 {
		return network{}, fmt.Errorf("cidr %q: need an IPv4 prefix from /8 to /29", cidr)
	}
	return network{prefix: p, gateway: p.Addr().Next()}, nil
}

// broadcast is the last address of the prefix.
func (n network) broadcast() netip.Addr {
	a := n.prefix.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= 1<<(32-n.prefix.Bits()) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// leaseRec is one persisted lease.
type leaseRec struct {
	IP       string    `json:"ip"`
	Tap      string    `json:"tap"`
	MAC      string    `json:"mac"`
	Forwards []Forward `json:"forwards,omitempty"`
}

// state is ipam.json.
type state struct {
	CIDR   string              `json:"cidr"`
	Leases map[string]leaseRec `json:"leases"`
}

func loadState(dir string) (state, error) {
	st := state{Leases: map[string]leaseRec{}}
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", stateFile, err)
	}
	if st.Leases == nil {
		st.Leases = map[string]leaseRec{}
	}
	return st, nil
}

func saveState(dir string, st state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, stateFile), append(b, '\n'), 0o600)
}

// allocate returns the address of id: its lease's when it has one inside n,
// else the lowest free host address after the gateway.
func allocate(st state, n network, id string) (netip.Addr, error) {
	if r, ok := st.Leases[id]; ok {
		if a, err := netip.ParseAddr(r.IP); err == nil && n.prefix.Contains(a) && a != n.gateway {
			return a, nil
		}
	}
	used := map[netip.Addr]bool{}
	for other, r := range st.Leases {
		if other == id {
			continue
		}
		if a, err := netip.ParseAddr(r.IP); err == nil {
			used[a] = true
		}
	}
	last := n.broadcast()
	for a := n.gateway.Next(); a.IsValid() && a.Less(last); a = a.Next() {
		if !used[a] {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free address in %s (%d leases)", n.prefix, len(st.Leases))
}

// normForwards validates forwards and fills defaults.
func normForwards(fwds []Forward) ([]Forward, error) {
	out := make([]Forward, 0, len(fwds))
	seen := map[string]bool{}
	for _, f := range fwds {
		f.Proto = strings.ToLower(f.Proto)
		if f.Proto == "" {
			f.Proto = "tcp"
		}
		if f.Proto != "tcp" && f.Proto != "udp" {
			return nil, fmt.Errorf("forward %d: protocol %q (want tcp or udp)", f.HostPort, f.Proto)
		}
		if f.HostPort < 1 || f.HostPort > 65535 || f.GuestPort < 1 || f.GuestPort > 65535 {
			return nil, fmt.Errorf("forward %s %d→%d: ports must be 1-65535", f.Proto, f.HostPort, f.GuestPort)
		}
		k := fmt.Sprintf("%s/%d", f.Proto, f.HostPort)
		if seen[k] {
			return nil, fmt.Errorf("forward %s: host port given twice", k)
		}
		seen[k] = true
		out = append(out, f)
	}
	return out, nil
}

// hostPortOwner returns the instance (other than id) forwarding f's host
// port, "" when none.
func hostPortOwner(st state, id string, f Forward) string {
	ids := make([]string, 0, len(st.Leases))
	for other := range st.Leases {
		ids = append(ids, other)
	}
	sort.Strings(ids)
	for _, other := range ids {
		if other == id {
			continue
		}
		for _, g := range st.Leases[other].Forwards {
			if g.Proto == f.Proto && g.HostPort == f.HostPort {
				return other
			}
		}
	}
	return ""
}

// leaseOf builds the Lease of a record.
func leaseOf(id string, r leaseRec, n network, dns []netip.Addr) Lease {
	ip, _ := netip.ParseAddr(r.IP)
	return Lease{InstanceID: id, Tap: r.Tap, MAC: r.MAC, IP: ip, Gateway: n.gateway,
		Prefix: n.prefix.Bits(), DNS: dns, Forwards: r.Forwards}
}

// parseDNS parses the configured resolvers.
func parseDNS(list []string) ([]netip.Addr, error) {
	if len(list) == 0 {
		list = []string{DefaultDNS}
	}
	var out []netip.Addr
	for _, s := range list {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("dns %q: want an IPv4 address", s)
		}
		out = append(out, a)
	}
	return out, nil
}

// tag is the nftables user data of an instance's rules.
func tag(id string) []byte { return []byte("drover:inst:" + id) }

// baseTag is the user data of the CIDR's base rules.
func baseTag(cidr string) []byte { return []byte("drover:base:" + cidr) }
