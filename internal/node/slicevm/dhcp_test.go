package slicevm

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/slicedhcp"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestDHCPReservationPhase: dhcp_reservation reserves the slot's MAC → IP
// in the store the agent's DHCP server answers from, and a release drops
// it; a MAC another VM holds, or an address outside the slice network,
// fails the phase (dhcp_reservation_failed) and the cleanup leaves the
// other VM's reservation alone.
func TestDHCPReservationPhase(t *testing.T) {
	mac, _ := net.ParseMAC(slotMAC)
	tests := []struct {
		name    string
		prep    func(t *testing.T, st *slicedhcp.Store)
		params  func(p task.VMProvisionParams) task.VMProvisionParams
		wantErr string
	}{
		{name: "reserved until release"},
		{name: "mac held by another vm", wantErr: "mac " + slotMAC + " is reserved for vm-other",
			prep: func(t *testing.T, st *slicedhcp.Store) {
				r, _ := slicedhcp.NewReservation(slotMAC, "10.77.0.99", "vm-other")
				if _, err := st.Reserve("vm-other", []slicedhcp.Reservation{r}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "address outside the slice network", wantErr: "10.78.0.10 is outside the slice network 10.77.0.0/24",
			params: func(p task.VMProvisionParams) task.VMProvisionParams {
				p.Slots[0].PrivateIP = "10.78.0.10"
				return p
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			st, err := slicedhcp.OpenStore(filepath.Join(e.state, "dhcp-hosts.d"), netip.MustParsePrefix("10.77.0.0/24"))
			if err != nil {
				t.Fatal(err)
			}
			e.p.opts.DHCP = st
			if tc.prep != nil {
				tc.prep(t, st)
			}
			params := e.failureParams()
			if tc.params != nil {
				params = tc.params(params)
			}
			ctx := context.Background()
			out, _, err := e.p.Provision(ctx, params, nil)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatal("provision succeeded")
				}
				if pe := asError(t, err); pe.Code != CodeDHCPFailed || pe.Phase != PhaseDHCPReservation || !strings.Contains(pe.Message, tc.wantErr) {
					t.Fatalf("err %+v, want %s in phase %s with %q", pe, CodeDHCPFailed, PhaseDHCPReservation, tc.wantErr)
				}
				assertGone(t, e, "vm-1", "slot-0")
				if vm, _, ok, _ := st.Lookup(mac); tc.prep != nil && (!ok || vm != "vm-other") {
					t.Fatalf("the other vm's reservation: %q %v", vm, ok)
				}
				return
			}
			if err != nil {
				t.Fatalf("provision: %v\n%+v", err, out.Phases)
			}
			vm, r, ok, _ := st.Lookup(mac)
			if !ok || vm != "vm-1" || r.IP.String() != slotIP || r.Hostname != "vm-1" {
				t.Fatalf("reservation after provision: %q %v %v", vm, r, ok)
			}
			if _, _, err := e.p.Release(ctx, task.VMReleaseParams{VMName: "vm-1", AllocationID: "alloc-1"}, nil); err != nil {
				t.Fatal(err)
			}
			if _, _, ok, _ := st.Lookup(mac); ok {
				t.Fatal("the reservation is still served after release")
			}
		})
	}
}
