package instances

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// capHost is a host whose capacity report has total (reserved 1 vCPU and
// 512 MiB on top) and a Free field that placement must ignore.
func capHost(id string, status api.HostStatus, total api.Capacity, labels map[string]string) store.Host {
	reserved := api.Capacity{VCPUs: 1, MemoryMiB: 512}
	b, _ := json.Marshal(api.CapacityReport{Total: addCapacity(total, reserved), Reserved: reserved,
		Free: api.Capacity{VCPUs: 999, MemoryMiB: 999999, DiskGiB: 999, GPUs: 99}})
	return store.Host{ID: id, Enabled: true, Status: status, Capacity: b, Labels: labels}
}

func testFleet(hosts ...store.Host) *fleet {
	return &fleet{hosts: hosts, used: map[string]api.Capacity{}, slots: map[string]map[string]string{}, names: map[string]bool{}}
}

func TestPlace(t *testing.T) {
	draining := capHost("draining", api.HostHealthy, api.Capacity{VCPUs: 64, MemoryMiB: 1 << 20}, nil)
	draining.Draining = true
	f := testFleet(
		capHost("small", api.HostHealthy, api.Capacity{VCPUs: 2, MemoryMiB: 2048, DiskGiB: 20}, map[string]string{"rack": "a"}),
		capHost("big", api.HostHealthy, api.Capacity{VCPUs: 16, MemoryMiB: 65536, DiskGiB: 500, GPUs: 2}, map[string]string{"rack": "b"}),
		capHost("stale", api.HostStale, api.Capacity{VCPUs: 64, MemoryMiB: 1 << 20, GPUs: 8}, nil),
		draining,
		store.Host{ID: "silent", Enabled: true, Status: api.HostHealthy},
	)
	// Instances already on "big": 12 vCPU and 60 GiB count, the deleted
	// one does not.
	f.add("big", "a", api.DesiredRunning, api.InstanceSpec{VCPUs: 8, MemoryMiB: 40960, GPUs: 1})
	f.add("big", "b", api.DesiredStopped, api.InstanceSpec{VCPUs: 4, MemoryMiB: 20480})
	f.add("big", "c", api.DesiredDeleted, api.InstanceSpec{VCPUs: 4, MemoryMiB: 4096, GPUs: 1, Slots: []string{"slot-0"}})
	tests := []struct {
		name     string
		req      api.PlacementRequest
		slots    slotCheck
		want     string
		wantFree api.Capacity
		wantCode string
		wantErrs []string // substrings of the 409 message
	}{
		{name: "most free memory wins, instances counted", req: api.PlacementRequest{Resources: api.Capacity{VCPUs: 1, MemoryMiB: 512}},
			want: "big", wantFree: api.Capacity{VCPUs: 4, MemoryMiB: 4096, DiskGiB: 500, GPUs: 1}},
		{name: "pinned to a node", req: api.PlacementRequest{NodeID: "small", Resources: api.Capacity{VCPUs: 1}},
			want: "small", wantFree: api.Capacity{VCPUs: 2, MemoryMiB: 2048, DiskGiB: 20}},
		{name: "label constraint", req: api.PlacementRequest{Labels: map[string]string{"rack": "a"}, Resources: api.Capacity{VCPUs: 1}}, want: "small",
			wantFree: api.Capacity{VCPUs: 2, MemoryMiB: 2048, DiskGiB: 20}},
		{name: "instances take the room", req: api.PlacementRequest{NodeID: "big", Resources: api.Capacity{VCPUs: 5, GPUs: 2}}, wantCode: "insufficient_capacity",
			wantErrs: []string{"big: short 1 vCPU (need 5, free 4), 1 GPU (need 2, free 1)"}},
		{name: "too many GPUs", req: api.PlacementRequest{Resources: api.Capacity{GPUs: 4}}, wantCode: "insufficient_capacity",
			wantErrs: []string{"small: short 4 GPU (need 4, free 0)", "big: short 3 GPU (need 4, free 1)",
				"stale: not schedulable (status stale", "draining: draining", "silent: no capacity reported yet"}},
		{name: "pinned node too small", req: api.PlacementRequest{NodeID: "small", Resources: api.Capacity{VCPUs: 8, MemoryMiB: 4096}},
			wantCode: "insufficient_capacity", wantErrs: []string{"6 vCPU (need 8, free 2)", "2048 MiB memory (need 4096, free 2048)"}},
		{name: "slots refused on the host with room", req: api.PlacementRequest{Resources: api.Capacity{VCPUs: 1}},
			slots: func(h store.Host) string { return "slot x is not approved" }, wantCode: "slot_unavailable",
			wantErrs: []string{"big: slot x is not approved", "small: slot x is not approved"}},
		{name: "slots pick the host that has them", req: api.PlacementRequest{Resources: api.Capacity{VCPUs: 1}},
			slots: func(h store.Host) string {
				if h.ID == "big" {
					return "no"
				}
				return ""
			}, want: "small", wantFree: api.Capacity{VCPUs: 2, MemoryMiB: 2048, DiskGiB: 20}},
		{name: "no match", req: api.PlacementRequest{NodeID: "ghost"}, wantCode: "insufficient_capacity", wantErrs: []string{"no host matches"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.place(tt.req, tt.slots)
			if tt.wantCode == "" {
				if err != nil || got.NodeID != tt.want || got.Free != tt.wantFree {
					t.Fatalf("place = %+v, %v; want %s with free %+v", got, err, tt.want, tt.wantFree)
				}
				return
			}
			var he *httpapi.Error
			if !errors.As(err, &he) || he.Status != 409 || he.Code != tt.wantCode {
				t.Fatalf("err = %v, want 409 %s", err, tt.wantCode)
			}
			for _, w := range tt.wantErrs {
				if !strings.Contains(he.Message, w) {
					t.Errorf("message %q lacks %q", he.Message, w)
				}
			}
		})
	}
}

func TestFleetClone(t *testing.T) {
	f := testFleet()
	f.add("h", "a", api.DesiredRunning, api.InstanceSpec{VCPUs: 1, Slots: []string{"s0"}})
	c := f.clone()
	c.add("h", "b", api.DesiredRunning, api.InstanceSpec{VCPUs: 2, Slots: []string{"s1"}})
	if f.used["h"].VCPUs != 1 || f.names["b"] || f.slots["h"]["s1"] != "" {
		t.Fatalf("planning on a clone changed the fleet: %+v %v %v", f.used, f.names, f.slots)
	}
	if c.used["h"].VCPUs != 3 || !c.names["a"] || c.slots["h"]["s0"] != "a" {
		t.Fatalf("clone lost the original: %+v %v %v", c.used, c.names, c.slots)
	}
}

func TestVCPUAllocationRatio(t *testing.T) {
	// 2 vCPUs after the reservation; 3 taken by instances.
	h := capHost("h", api.HostHealthy, api.Capacity{VCPUs: 2, MemoryMiB: 4096}, nil)
	used := api.Capacity{VCPUs: 3, MemoryMiB: 1024}
	for _, tc := range []struct {
		ratio     float64
		wantVCPUs int
	}{
		{0, -1}, // unset means 1:1
		{1, -1},
		{4, 5},
		{1.5, 0},
	} {
		free, ok := freeOf(h, used, tc.ratio)
		if !ok || free.VCPUs != tc.wantVCPUs || free.MemoryMiB != 3072 {
			t.Errorf("ratio %g: free = %+v (ok %t), want %d vCPUs and memory not overcommitted (3072)", tc.ratio, free, ok, tc.wantVCPUs)
		}
	}
	f := testFleet(h)
	f.cpuRatio = 4
	f.add("h", "a", api.DesiredRunning, api.InstanceSpec{VCPUs: 3, MemoryMiB: 1024})
	if _, err := f.place(api.PlacementRequest{Resources: api.Capacity{VCPUs: 5, MemoryMiB: 512}}, nil); err != nil {
		t.Errorf("5 vCPUs at ratio 4 on 2 CPUs with 3 used: %v", err)
	}
	if _, err := f.place(api.PlacementRequest{Resources: api.Capacity{VCPUs: 6}}, nil); err == nil {
		t.Error("6 vCPUs at ratio 4 on 2 CPUs with 3 used: placed, want insufficient_capacity")
	}
}
