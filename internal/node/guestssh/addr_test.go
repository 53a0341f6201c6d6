package guestssh

import (
	"context"
	"net/netip"
	"testing"
)

// TestCheckAddr is the rule of where the node dials a guest's SSH: the
// loopback, or the VM's own recorded address inside the agent's slice
// network, and nothing else.
func TestCheckAddr(t *testing.T) {
	slice := netip.MustParsePrefix("10.77.0.0/24")
	vm := netip.MustParseAddr("10.77.0.10")
	tests := []struct {
		name     string
		addr     string
		sliceNet netip.Prefix
		vmAddr   netip.Addr
		ok       bool
	}{
		{"loopback forward", "127.0.0.1:40022", netip.Prefix{}, netip.Addr{}, true},
		{"loopback, other 127/8", "127.0.0.2:22", slice, vm, true},
		{"ipv6 loopback", "[::1]:2222", netip.Prefix{}, netip.Addr{}, true},
		{"the vm's own address in the slice cidr", "10.77.0.10:22", slice, vm, true},
		{"the vm's address, no slice cidr configured", "10.77.0.10:22", netip.Prefix{}, vm, false},
		{"the vm's address, none recorded", "10.77.0.10:22", slice, netip.Addr{}, false},
		{"another vm's address", "10.77.0.11:22", slice, vm, false},
		{"the gateway (the agent's bridge)", "10.77.0.1:22", slice, netip.MustParseAddr("10.77.0.1"), false},
		{"the network address", "10.77.0.0:22", slice, netip.MustParseAddr("10.77.0.0"), false},
		{"the broadcast address", "10.77.0.255:22", slice, netip.MustParseAddr("10.77.0.255"), false},
		{"outside the cidr, though recorded", "10.78.0.10:22", slice, netip.MustParseAddr("10.78.0.10"), false},
		{"an arbitrary host", "192.0.2.7:22", slice, vm, false},
		{"a public address", "1.1.1.1:22", slice, vm, false},
		{"unspecified", "0.0.0.0:22", slice, vm, false},
		{"a name, not an IP", "localhost:22", slice, vm, false},
		{"a name resolving elsewhere", "guest.example:22", slice, vm, false},
		{"no port", "10.77.0.10", slice, vm, false},
		{"v4-mapped vm address", "[::ffff:10.77.0.10]:22", slice, vm, true},
		{"link-local with a zone", "[fe80::1%br-slice]:22", slice, vm, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckAddr(tc.addr, tc.sliceNet, tc.vmAddr)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckAddr(%q, %v, %v) = %v, want ok=%v", tc.addr, tc.sliceNet, tc.vmAddr, err, tc.ok)
			}
		})
	}
}

// Dial applies the rule before anything else: a refused address is
// guest_terminal_unavailable and nothing is dialed.
func TestDialRefusesAddress(t *testing.T) {
	_, err := Dial(context.Background(), Target{Addr: "10.77.0.11:22", User: "alice", KeyPath: "/nonexistent",
		SliceNet: netip.MustParsePrefix("10.77.0.0/24"), VMAddr: netip.MustParseAddr("10.77.0.10")}, "")
	de, ok := err.(*DialError)
	if !ok || de.Code != CodeUnavailable {
		t.Fatalf("Dial: %v, want %s", err, CodeUnavailable)
	}
}

func TestLastAddr(t *testing.T) {
	for p, want := range map[string]string{"10.77.0.0/24": "10.77.0.255", "10.77.0.0/16": "10.77.255.255",
		"10.77.0.8/29": "10.77.0.15", "fd00::/120": "fd00::ff"} {
		if got := lastAddr(netip.MustParsePrefix(p)); got.String() != want {
			t.Errorf("lastAddr(%s) = %s, want %s", p, got, want)
		}
	}
}
