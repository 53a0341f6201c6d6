package netsetup

import (
	"net/netip"
	"strings"
	"testing"
)

func TestAllocate(t *testing.T) {
	n, err := parseNetwork("10.1.2.0/29")
	if err != nil {
		t.Fatal(err)
	}
	st := state{Leases: map[string]leaseRec{}}
	var got []string
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		a, err := allocate(st, n, id)
		if err != nil {
			t.Fatal(err)
		}
		st.Leases[id] = leaseRec{IP: a.String()}
		got = append(got, a.String())
	}
	if got[0] != "10.1.2.2" || got[4] != "10.1.2.6" {
		t.Fatalf("allocated %v", got)
	}
	if _, err := allocate(st, n, "f"); err == nil {
		t.Fatal("a full /29 allocated a 6th address (broadcast?)")
	}
	if a, _ := allocate(st, n, "c"); a != netip.MustParseAddr("10.1.2.4") {
		t.Fatalf("existing lease moved to %s", a)
	}
	for _, bad := range []string{"fd00::/64", "10.0.0.0/30", "nonsense"} {
		if _, err := parseNetwork(bad); err == nil {
			t.Fatalf("%s accepted", bad)
		}
	}
	if TapName("x") == TapName("y") || len(TapName("x")) != 15 || MACFor("x")[:6] != "02:d5:" {
		t.Fatal("names")
	}
}

func TestConfigCheck(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{}, ""},
		{"set", Config{Bridge: "br-vm", CIDR: "172.30.0.0/16", DNS: []string{"10.0.0.53", "9.9.9.9"}}, ""},
		{"long bridge", Config{Bridge: "a-bridge-name-too-long"}, "bridge name"},
		{"bridge with slash", Config{Bridge: "br/0"}, "bridge name"},
		{"ipv6 cidr", Config{CIDR: "fd00::/64"}, "cidr"},
		{"cidr too small", Config{CIDR: "10.0.0.0/30"}, "cidr"},
		{"dns not an address", Config{DNS: []string{"dns.example"}}, "dns"},
		{"ipv6 dns", Config{DNS: []string{"2606:4700::1111"}}, "dns"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Check()
			if (err == nil) != (c.wantErr == "") || (err != nil && !strings.HasPrefix(err.Error(), c.wantErr)) {
				t.Fatalf("Check: %v, want %q", err, c.wantErr)
			}
		})
	}
}
