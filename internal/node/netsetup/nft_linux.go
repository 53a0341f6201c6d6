//go:build linux

package netsetup

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Chains of the drover table.
const (
	chainPre  = "prerouting"
	chainOut  = "output"
	chainPost = "postrouting"
)

// ipsDstNAT is the conntrack status bit of a destination-NATed connection.
const ipsDstNAT = 0x20

// nftConn opens an nftables connection in the manager's namespace.
func (m *Manager) nftConn() (*nftables.Conn, error) {
	if m.nsFd >= 0 {
		return nftables.New(nftables.WithNetNSFd(m.nsFd))
	}
	return nftables.New()
}

func (m *Manager) table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyIPv4, Name: m.cfg.Table}
}

func (m *Manager) chains() map[string]*nftables.Chain {
	t := m.table()
	return map[string]*nftables.Chain{
		chainPre: {Name: chainPre, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest},
		chainOut: {Name: chainOut, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest},
		chainPost: {Name: chainPost, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource},
	}
}

// ensureTable creates the table, its chains and the CIDR's base rules
// where missing (idempotent: existing ones are kept).
func (m *Manager) ensureTable(id string) error {
	c, err := m.nftConn()
	if err != nil {
		return fail(id, "nft connect", err)
	}
	c.AddTable(m.table())
	for _, ch := range m.chains() {
		c.AddChain(ch)
	}
	if err := c.Flush(); err != nil {
		return fail(id, "nft add table", err)
	}
	post := m.chains()[chainPost]
	rules, err := c.GetRules(m.table(), post)
	if err != nil {
		return fail(id, "nft list rules", err)
	}
	want := baseTag(m.net.prefix.String())
	for _, r := range rules {
		if bytes.Equal(r.UserData, want) {
			return nil
		}
	}
	for _, exprs := range m.baseRules() {
		c.AddRule(&nftables.Rule{Table: m.table(), Chain: post, Exprs: exprs, UserData: want})
	}
	if err := c.Flush(); err != nil {
		return fail(id, "nft add rule", err)
	}
	return nil
}

// matchPrefix loads an IPv4 header address (offset 12 saddr, 16 daddr) and
// compares it, masked, with the CIDR.
func (m *Manager) matchPrefix(offset uint32, op expr.CmpOp) []expr.Any {
	mask := net.CIDRMask(m.net.prefix.Bits(), 32)
	a := m.net.prefix.Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: 1, Data: a[:]},
	}
}

// baseRules: masquerade what leaves the CIDR; masquerade DNATed traffic
// between instances (hairpin), so replies come back through the host.
func (m *Manager) baseRules() [][]expr.Any {
	out := append(m.matchPrefix(12, expr.CmpOpEq), m.matchPrefix(16, expr.CmpOpNeq)...)
	out = append(out, &expr.Masq{})
	hairpin := append(m.matchPrefix(12, expr.CmpOpEq),
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Masq{})
	return [][]expr.Any{out, hairpin}
}

// dnatRule: traffic to a local address on f.HostPort goes to ip:f.GuestPort.
func dnatRule(ip netip.Addr, f Forward) []expr.Any {
	proto := byte(unix.IPPROTO_TCP)
	if f.Proto == "udp" {
		proto = unix.IPPROTO_UDP
	}
	a := ip.As4()
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(f.HostPort))},
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(uint16(f.GuestPort))},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// setForwards replaces the instance's DNAT rules with fwds (none: removed).
func (m *Manager) setForwards(id string, ip netip.Addr, fwds []Forward) error {
	c, err := m.nftConn()
	if err != nil {
		return fail(id, "nft connect", err)
	}
	want := tag(id)
	if _, err := m.deleteRules(c, func(ud []byte) bool { return bytes.Equal(ud, want) }); err != nil {
		return fail(id, "nft delete rule", err)
	}
	if len(fwds) == 0 {
		return nil
	}
	chains := m.chains()
	for _, f := range fwds {
		for _, name := range []string{chainPre, chainOut} {
			c.AddRule(&nftables.Rule{Table: m.table(), Chain: chains[name], Exprs: dnatRule(ip, f), UserData: want})
		}
	}
	if err := c.Flush(); err != nil {
		return fail(id, "nft add rule", err)
	}
	return nil
}

// deleteRules deletes every rule of the table whose user data match says
// yes, and returns how many. A missing table deletes nothing.
func (m *Manager) deleteRules(c *nftables.Conn, match func([]byte) bool) (int, error) {
	if _, err := c.ListTableOfFamily(m.cfg.Table, nftables.TableFamilyIPv4); err != nil {
		return 0, nil // no table, no rules
	}
	n := 0
	for _, ch := range m.chains() {
		rules, err := c.GetRules(m.table(), ch)
		if err != nil {
			return n, fmt.Errorf("list %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			if match(r.UserData) {
				if err := c.DelRule(r); err != nil {
					return n, fmt.Errorf("delete rule in %s: %w", ch.Name, err)
				}
				n++
			}
		}
	}
	if n > 0 {
		if err := c.Flush(); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// RuleTags lists the user data of every rule in Drover's table, chain by
// chain ("prerouting: drover:inst:web-1"); for tests and diagnostics.
func (m *Manager) RuleTags() ([]string, error) {
	var out []string
	err := m.do(func() error {
		c, err := m.nftConn()
		if err != nil {
			return err
		}
		if _, err := c.ListTableOfFamily(m.cfg.Table, nftables.TableFamilyIPv4); err != nil {
			return nil
		}
		for _, name := range []string{chainPre, chainOut, chainPost} {
			rules, err := c.GetRules(m.table(), m.chains()[name])
			if err != nil {
				return fmt.Errorf("list %s: %w", name, err)
			}
			for _, r := range rules {
				out = append(out, name+": "+string(r.UserData))
			}
		}
		return nil
	})
	return out, err
}

// orphanRule says whether a rule's user data belong to no lease (an
// instance without one, or base rules of another CIDR).
func orphanRule(st state, cidr string) func([]byte) bool {
	return func(ud []byte) bool {
		s := string(ud)
		switch {
		case strings.HasPrefix(s, "drover:inst:"):
			_, ok := st.Leases[strings.TrimPrefix(s, "drover:inst:")]
			return !ok
		case strings.HasPrefix(s, "drover:base:"):
			return s != string(baseTag(cidr))
		}
		return false
	}
}
