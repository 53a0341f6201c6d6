package netsetup

import (
	"context"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestEnsureNetworkOwnTable: EnsureNetwork makes a network with no
// instance (the slice network: bridge with its gateway address, NAT base
// rules), idempotently, in a table of its own, which the microVM
// network's Reconcile leaves alone (and the other way round).
func TestEnsureNetworkOwnTable(t *testing.T) {
	m, ns, _ := newManager(t) // the microVM network, table "drover"
	attach(t, m, "web-a")
	sl, err := New(Config{Bridge: "brslt0", CIDR: "10.77.0.0/24", StateDir: t.TempDir(), NetNSPath: nsPath(ns),
		Table: "drover_slice"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sl.Close() })
	ctx := context.Background()
	for range 2 {
		if err := sl.EnsureNetwork(ctx); err != nil {
			t.Fatal(err)
		}
	}
	br := linkIn(t, ns, "brslt0")
	if br == nil || br.Type() != "bridge" || br.Attrs().OperState == netlink.OperDown {
		t.Fatalf("slice bridge: %v", br)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addrs, err := h.AddrList(br, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != "10.77.0.1/24" {
		t.Fatalf("slice bridge addresses %v, %v", addrs, err)
	}
	sliceTags := func() []string {
		tags, err := sl.RuleTags()
		if err != nil {
			t.Fatal(err)
		}
		return tags
	}
	if got := strings.Join(sliceTags(), "|"); got != "postrouting: drover:base:10.77.0.0/24|postrouting: drover:base:10.77.0.0/24" {
		t.Fatalf("slice table rules %q, want the two base rules once", got)
	}
	if _, err := m.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sl.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := len(sliceTags()); got != 2 {
		t.Fatalf("the microVM network's reconcile touched the slice table: %d rules left", got)
	}
	tags, err := m.RuleTags()
	if err != nil || count(tags, "drover:base:10.99.0.0/24") != 2 {
		t.Fatalf("the slice network's reconcile touched the microVM table: %v, %v", tags, err)
	}
}

func TestConfigCheckTable(t *testing.T) {
	for _, tc := range []struct {
		table string
		ok    bool
	}{{"", true}, {"drover_slice", true}, {"Drover", false}, {"a b", false}, {strings.Repeat("a", 33), false}} {
		if err := (Config{Table: tc.table}).Check(); (err == nil) != tc.ok {
			t.Errorf("table %q: %v", tc.table, err)
		}
	}
}
