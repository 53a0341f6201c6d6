package netsetup

import (
	"net/netip"
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
