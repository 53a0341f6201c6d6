package slicedhcp

// What the server answers: the DHCPv4 logic, apart from sockets.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// DefaultLeaseTime is the lease time when Config.LeaseTime is 0.
const DefaultLeaseTime = time.Hour

// Config is the server's side of the slice network.
type Config struct {
	// Interface is the slice bridge the server listens on (it must be up
	// with ServerIP on it).
	Interface string
	// Subnet is the slice network; ServerIP (default its first host
	// address) is the server identifier and Router (default ServerIP)
	// the gateway given to guests.
	Subnet   netip.Prefix
	ServerIP netip.Addr
	Router   netip.Addr
	// DNS are the resolvers given to guests (none: the option is left out).
	DNS []netip.Addr
	// LeaseTime is the lease given (default DefaultLeaseTime); guests
	// renew at half of it.
	LeaseTime time.Duration
	Log       *slog.Logger
}

// withDefaults checks c and fills in its defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Interface == "" || len(c.Interface) > 15 {
		return c, fmt.Errorf("slicedhcp: interface %q: 1-15 characters", c.Interface)
	}
	if !c.Subnet.IsValid() || !c.Subnet.Addr().Is4() || c.Subnet.Bits() > 30 {
		return c, fmt.Errorf("slicedhcp: subnet %s: want an IPv4 prefix of /30 or larger", c.Subnet)
	}
	c.Subnet = c.Subnet.Masked()
	if !c.ServerIP.IsValid() {
		c.ServerIP = c.Subnet.Addr().Next()
	}
	if !c.Router.IsValid() {
		c.Router = c.ServerIP
	}
	for _, a := range []netip.Addr{c.ServerIP, c.Router} {
		if !c.Subnet.Contains(a) {
			return c, fmt.Errorf("slicedhcp: %s is outside the subnet %s", a, c.Subnet)
		}
	}
	for _, a := range c.DNS {
		if !a.Is4() {
			return c, fmt.Errorf("slicedhcp: dns %s: want an IPv4 address", a)
		}
	}
	if c.LeaseTime <= 0 {
		c.LeaseTime = DefaultLeaseTime
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c, nil
}

// errIgnore marks a request the server does not answer.
var errIgnore = errors.New("not answered")

// reply builds the answer to req from the store's reservations: an OFFER
// to a DISCOVER, an ACK (or a NAK for an address that is not the
// reserved one) to a REQUEST, an ACK without a lease to an INFORM. An
// unknown MAC, a request meant for another server, a relayed request and
// a RELEASE or DECLINE get none (errIgnore, wrapped with why).
func reply(c Config, st *Store, req *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	if req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return nil, fmt.Errorf("%w: not an Ethernet BOOTREQUEST", errIgnore)
	}
	if !req.GatewayIPAddr.IsUnspecified() && req.GatewayIPAddr != nil {
		return nil, fmt.Errorf("%w: relayed through %s (the slice network has no relays)", errIgnore, req.GatewayIPAddr)
	}
	vm, r, ok, bad := st.Lookup(req.ClientHWAddr)
	for _, err := range bad {
		c.Log.Warn("slicedhcp: skipping a reservation file", "err", err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: no reservation for %s", errIgnore, req.ClientHWAddr)
	}
	if !c.Subnet.Contains(r.IP) {
		return nil, fmt.Errorf("%w: %s's reservation %s (vm %s) is outside %s", errIgnore, req.ClientHWAddr, r.IP, vm, c.Subnet)
	}
	ip := net.IP(r.IP.AsSlice())
	mods := []dhcpv4.Modifier{
		dhcpv4.WithServerIP(net.IP(c.ServerIP.AsSlice())),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(c.ServerIP.AsSlice()))),
		dhcpv4.WithNetmask(net.CIDRMask(c.Subnet.Bits(), 32)),
		dhcpv4.WithRouter(net.IP(c.Router.AsSlice())),
	}
	if len(c.DNS) > 0 {
		dns := make([]net.IP, len(c.DNS))
		for i, a := range c.DNS {
			dns[i] = net.IP(a.AsSlice())
		}
		mods = append(mods, dhcpv4.WithDNS(dns...))
	}
	if r.Hostname != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptHostName(r.Hostname)))
	}
	lease := dhcpv4.WithLeaseTime(uint32(c.LeaseTime / time.Second))
	switch mt := req.MessageType(); mt {
	case dhcpv4.MessageTypeDiscover:
		mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer), dhcpv4.WithYourIP(ip), lease)
	case dhcpv4.MessageTypeRequest:
		if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(net.IP(c.ServerIP.AsSlice())) {
			return nil, fmt.Errorf("%w: %s chose server %s", errIgnore, req.ClientHWAddr, sid)
		}
		want := req.RequestedIPAddress()
		if want == nil || want.IsUnspecified() {
			want = req.ClientIPAddr
		}
		if want != nil && !want.IsUnspecified() && !want.Equal(ip) {
			return dhcpv4.NewReplyFromRequest(req, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(c.ServerIP.AsSlice()))),
				dhcpv4.WithOption(dhcpv4.OptMessage(fmt.Sprintf("%s is reserved %s, not %s", req.ClientHWAddr, ip, want))))
		}
		mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeAck), dhcpv4.WithYourIP(ip), lease)
	case dhcpv4.MessageTypeInform:
		mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeAck))
	default:
		return nil, fmt.Errorf("%w: %s from %s", errIgnore, mt, req.ClientHWAddr)
	}
	return dhcpv4.NewReplyFromRequest(req, mods...)
}

// replyAddr is where an answer goes: to the client's address when it has
// one (a renewal, an INFORM), else broadcast on the bridge (the client
// has no address to receive a unicast on yet).
func replyAddr(req, resp *dhcpv4.DHCPv4) *net.UDPAddr {
	if resp.MessageType() != dhcpv4.MessageTypeNak && req.ClientIPAddr != nil && !req.ClientIPAddr.IsUnspecified() {
		return &net.UDPAddr{IP: req.ClientIPAddr, Port: dhcpv4.ClientPort}
	}
	return &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
}
