package sliceflow

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

func capsWith(t *testing.T, sn *api.SliceNetwork) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(api.Capabilities{Hostname: "h1", OSFamily: api.OSLinux, CPUCores: 4, SliceNetwork: sn})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSliceNetworkChoice: a tap on the agent's slice bridge when it serves
// a network holding every slot's address, else user-mode networking.
func TestSliceNetworkChoice(t *testing.T) {
	slots := func(ips ...string) []task.VMSlot {
		var out []task.VMSlot
		for i, ip := range ips {
			out = append(out, task.VMSlot{SlotID: "s" + string(rune('0'+i)), PrivateIP: ip})
		}
		return out
	}
	served := &api.SliceNetwork{Bridge: "br-slice", CIDR: "10.77.0.0/24"}
	for _, tc := range []struct {
		name   string
		caps   json.RawMessage
		slots  []task.VMSlot
		bridge string
		why    string
	}{
		{"no capabilities", nil, slots("10.77.0.10"), "", "serves no slice network"},
		{"no slice network", capsWith(t, nil), slots("10.77.0.10"), "", "serves no slice network"},
		{"undecodable", json.RawMessage(`{"slice_network":7}`), slots("10.77.0.10"), "", "serves no slice network"},
		{"served", capsWith(t, served), slots("10.77.0.10", "10.77.0.11"), "br-slice", "slice network 10.77.0.0/24 on br-slice"},
		{"unmasked cidr", capsWith(t, &api.SliceNetwork{Bridge: "br0", CIDR: "10.77.0.1/24"}), slots("10.77.0.10"), "br0", "10.77.0.0/24"},
		{"outside", capsWith(t, served), slots("10.77.0.10", "10.78.0.11"), "", `slot s1's address "10.78.0.11"`},
		{"gateway", capsWith(t, served), slots("10.77.0.1"), "", "not a host address"},
		{"network", capsWith(t, served), slots("10.77.0.0"), "", "not a host address"},
		{"broadcast", capsWith(t, served), slots("10.77.0.255"), "", "not a host address"},
		{"no address", capsWith(t, served), slots(""), "", "not a host address"},
		{"bad cidr", capsWith(t, &api.SliceNetwork{Bridge: "br0", CIDR: "nope"}), slots("10.77.0.10"), "", "not usable"},
		{"ipv6 cidr", capsWith(t, &api.SliceNetwork{Bridge: "br0", CIDR: "fd00::/64"}), slots("10.77.0.10"), "", "not usable"},
		{"no bridge", capsWith(t, &api.SliceNetwork{CIDR: "10.77.0.0/24"}), slots("10.77.0.10"), "", "not usable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bridge, why := sliceNetwork(store.Host{ID: "h1", Capabilities: tc.caps}, tc.slots)
			if bridge != tc.bridge || !strings.Contains(why, tc.why) {
				t.Fatalf("got %q (%s), want %q (%s)", bridge, why, tc.bridge, tc.why)
			}
		})
	}
}

// TestProvisionOnSliceNetwork: with the host's agent serving the slice
// network, slice.vm_provision asks for a tap on its bridge (the slots keep
// their MACs and reserved IPs), lease_slots says so, and the plan keeps
// it; the VM's recorded address is the slot's.
func TestProvisionOnSliceNetwork(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sn     *api.SliceNetwork
		bridge string
	}{
		{"served", &api.SliceNetwork{Bridge: "br-slice", CIDR: "10.77.0.0/24"}, "br-slice"},
		{"not served", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			if _, err := h.st.UpdateHost(h.ctx, "h1", func(x *store.Host) error {
				x.Capabilities = capsWith(t, tc.sn)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := h.create("alc_n", 1); err != nil {
				t.Fatal(err)
			}
			prov := h.queued(task.TypeVMProvision)
			if len(prov) != 1 {
				t.Fatalf("%d provision tasks", len(prov))
			}
			p, fe := task.DecodeVMProvisionParams(prov[0].Params)
			if fe != nil {
				t.Fatalf("params: %v", fe)
			}
			if p.OVSBridge != tc.bridge || p.Network != nil || len(p.Slots) != 1 ||
				p.Slots[0].MACAddress != "52:54:00:00:00:00" || p.Slots[0].PrivateIP != "10.77.0.10" {
				t.Fatalf("provision params: bridge %q network %+v slots %+v", p.OVSBridge, p.Network, p.Slots)
			}
			v, err := h.room.View(h.ctx, "alc_n")
			if err != nil {
				t.Fatal(err)
			}
			wantWhy := "user-mode networking"
			if tc.bridge != "" {
				wantWhy = "slice network 10.77.0.0/24 on br-slice"
			}
			if len(v.Steps) == 0 || !strings.Contains(v.Steps[0].Detail, wantWhy) {
				t.Fatalf("lease_slots detail: %+v", v.Steps)
			}
			out, wantIP := readyOutput(), "10.77.0.10" // a tap VM: the slot's address, ssh at it
			if tc.bridge == "" {
				out["private_ip"], out["ssh_host"], out["ssh_port"] = "10.0.2.15", "127.0.0.1", 40022
				wantIP = "10.0.2.15"
			}
			h.answer(prov[0].ID, true, out, true)
			h.wantStatus("alc_n", store.SliceFlowProvisioning, api.AllocationProvisioning)
			v, err = h.room.View(h.ctx, "alc_n")
			if err != nil {
				t.Fatal(err)
			}
			if v.VM == nil || v.VM.PrivateIP != wantIP {
				t.Fatalf("vm: %+v", v.VM)
			}
		})
	}
}
