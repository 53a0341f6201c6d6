package slicedhcp

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

func mustRes(t *testing.T, mac, ip, host string) Reservation {
	t.Helper()
	r, err := NewReservation(mac, ip, host)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestStoreReserve(t *testing.T) {
	subnet := netip.MustParsePrefix("10.77.0.0/24")
	tests := []struct {
		name    string
		vm      string
		rs      []Reservation
		wantErr string
	}{
		{"ok", "b", []Reservation{mustRes(t, "52:54:00:00:00:02", "10.77.0.11", "b")}, ""},
		{"same vm again replaces", "a", []Reservation{mustRes(t, "52:54:00:00:00:01", "10.77.0.12", "a")}, ""},
		{"mac of another vm", "b", []Reservation{mustRes(t, "52:54:00:00:00:01", "10.77.0.20", "b")}, "reserved for a"},
		{"ip of another vm", "b", []Reservation{mustRes(t, "52:54:00:00:00:09", "10.77.0.10", "b")}, "reserved for a"},
		{"mac twice", "b", []Reservation{mustRes(t, "52:54:00:00:00:07", "10.77.0.30", "b"),
			mustRes(t, "52:54:00:00:00:07", "10.77.0.31", "b")}, "reserved for b twice"},
		{"outside the subnet", "b", []Reservation{mustRes(t, "52:54:00:00:00:08", "10.78.0.10", "b")}, "outside the slice network"},
		{"the gateway", "b", []Reservation{mustRes(t, "52:54:00:00:00:08", "10.77.0.1", "b")}, "gateway"},
		{"the broadcast", "b", []Reservation{mustRes(t, "52:54:00:00:00:08", "10.77.0.255", "b")}, "broadcast"},
		{"none", "b", nil, "no reservations"},
		{"bad vm name", "../x", []Reservation{mustRes(t, "52:54:00:00:00:08", "10.77.0.40", "b")}, "plain file name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "hosts")
			st, err := OpenStore(dir, subnet)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Reserve("a", []Reservation{mustRes(t, "52:54:00:00:00:01", "10.77.0.10", "a")}); err != nil {
				t.Fatal(err)
			}
			_, err = st.Reserve(tc.vm, tc.rs)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				b, _ := os.ReadFile(st.Path(tc.vm))
				if want := tc.rs[0].String() + "\n"; string(b) != want {
					t.Fatalf("file %q, want %q", b, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			if strings.Contains(tc.wantErr, "reserved for") && !errors.Is(err, ErrConflict) {
				t.Fatalf("err %v does not wrap ErrConflict", err)
			}
			if got := st.VMs(); strings.Join(got, ",") != "a" {
				t.Fatalf("a refused reservation changed the store: %v", got)
			}
		})
	}
}

func TestOpenStoreParses(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "vm1.conf"), "# comment\n52:54:00:00:00:01,10.77.0.10,vm1\n\n52:54:00:00:00:02,10.77.0.11\n", 0o644)
	writeTestFile(t, filepath.Join(dir, ".tmp-123"), "garbage", 0o644)
	st, err := OpenStore(dir, netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	rs := st.Reservations("vm1")
	if len(rs) != 2 || rs[0].Hostname != "vm1" || rs[1].IP != netip.MustParseAddr("10.77.0.11") {
		t.Fatalf("reservations %v", rs)
	}
	writeTestFile(t, filepath.Join(dir, "bad.conf"), "52:54:00:00:00:03\n", 0o644)
	if bad := st.Bad(); len(bad) != 1 || !strings.Contains(bad[0].Error(), "bad.conf") {
		t.Fatalf("a bad file: %v", bad)
	}
	if got := strings.Join(st.VMs(), ","); got != "bad,vm1" {
		t.Fatalf("vms %s: a bad file's vm must be listed (prunable)", got)
	}
	if dropped, err := st.Prune(func(vm string) bool { return vm == "vm1" }); err != nil || strings.Join(dropped, ",") != "bad" {
		t.Fatalf("prune %v %v", dropped, err)
	}
}

func TestReply(t *testing.T) {
	st, err := OpenStore(filepath.Join(t.TempDir(), "h"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reserve("vm", []Reservation{mustRes(t, "52:54:00:00:00:01", "10.77.0.10", "vm")}); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config{Interface: "br", Subnet: netip.MustParsePrefix("10.77.0.0/24")}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	known, _ := net.ParseMAC("52:54:00:00:00:01")
	unknown, _ := net.ParseMAC("52:54:00:00:00:99")
	req := func(mac net.HardwareAddr, mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
		d, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(mt)}, mods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	tests := []struct {
		name string
		req  *dhcpv4.DHCPv4
		want dhcpv4.MessageType // MessageTypeNone: no answer
	}{
		{"discover", req(known, dhcpv4.MessageTypeDiscover), dhcpv4.MessageTypeOffer},
		{"request", req(known, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 77, 0, 10)))), dhcpv4.MessageTypeAck},
		{"request for another address", req(known, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 77, 0, 50)))), dhcpv4.MessageTypeNak},
		{"request to another server", req(known, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 77, 0, 2)))), dhcpv4.MessageTypeNone},
		{"unknown mac", req(unknown, dhcpv4.MessageTypeDiscover), dhcpv4.MessageTypeNone},
		{"release", req(known, dhcpv4.MessageTypeRelease), dhcpv4.MessageTypeNone},
		{"relayed", req(known, dhcpv4.MessageTypeDiscover, dhcpv4.WithGatewayIP(net.IPv4(10, 0, 0, 1))), dhcpv4.MessageTypeNone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := reply(cfg, st, tc.req)
			if tc.want == dhcpv4.MessageTypeNone {
				if !errors.Is(err, errIgnore) {
					t.Fatalf("answered %v (%v), want none", resp, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.MessageType() != tc.want {
				t.Fatalf("answer %s, want %s", resp.MessageType(), tc.want)
			}
			if tc.want != dhcpv4.MessageTypeNak && !resp.YourIPAddr.Equal(net.IPv4(10, 77, 0, 10)) {
				t.Fatalf("yiaddr %s", resp.YourIPAddr)
			}
		})
	}
}

func writeTestFile(t *testing.T, path, s string, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), perm); err != nil {
		t.Fatal(err)
	}
}
