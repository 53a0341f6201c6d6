package server

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/api"
	"github.com/drover-dev/drover/internal/store"
)

func capHost(id string, status api.HostStatus, free api.Capacity, labels map[string]string) store.Host {
	b, _ := json.Marshal(api.CapacityReport{Free: free})
	return store.Host{ID: id, Enabled: true, Status: status, Capacity: b, Labels: labels}
}

func TestPlaceOn(t *testing.T) {
	hosts := []store.Host{
		capHost("small", api.HostHealthy, api.Capacity{VCPUs: 2, MemoryMiB: 2048, DiskGiB: 20}, map[string]string{"rack": "a"}),
		capHost("big", api.HostHealthy, api.Capacity{VCPUs: 16, MemoryMiB: 65536, DiskGiB: 500, GPUs: 2}, map[string]string{"rack": "b"}),
		capHost("stale", api.HostStale, api.Capacity{VCPUs: 64, MemoryMiB: 1 << 20, GPUs: 8}, nil),
	}
	tests := []struct {
		name     string
		req      api.PlacementRequest
		want     string
		wantErrs []string // substrings of the 409 message
	}{
		{name: "fits anywhere: most free memory wins", req: api.PlacementRequest{Resources: api.Capacity{VCPUs: 1, MemoryMiB: 512}}, want: "big"},
		{name: "pinned to a node", req: api.PlacementRequest{NodeID: "small", Resources: api.Capacity{VCPUs: 1}}, want: "small"},
		{name: "label constraint", req: api.PlacementRequest{Labels: map[string]string{"rack": "a"}, Resources: api.Capacity{VCPUs: 1}}, want: "small"},
		{name: "too many GPUs", req: api.PlacementRequest{Resources: api.Capacity{GPUs: 4}},
			wantErrs: []string{"small: short 4 GPU (need 4, free 0)", "big: short 2 GPU (need 4, free 2)", "stale: not schedulable (status stale"}},
		{name: "pinned node too small", req: api.PlacementRequest{NodeID: "small", Resources: api.Capacity{VCPUs: 8, MemoryMiB: 4096}},
			wantErrs: []string{"6 vCPU (need 8, free 2)", "2048 MiB memory (need 4096, free 2048)"}},
		{name: "no match", req: api.PlacementRequest{NodeID: "ghost"}, wantErrs: []string{"no host matches"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := placeOn(hosts, tt.req)
			if len(tt.wantErrs) == 0 {
				if err != nil || got.NodeID != tt.want {
					t.Fatalf("placeOn = %+v, %v; want %s", got, err, tt.want)
				}
				return
			}
			var he *httpError
			if !errors.As(err, &he) || he.status != 409 || he.code != "insufficient_capacity" {
				t.Fatalf("err = %v, want 409 insufficient_capacity", err)
			}
			for _, w := range tt.wantErrs {
				if !strings.Contains(he.msg, w) {
					t.Errorf("message %q lacks %q", he.msg, w)
				}
			}
		})
	}
}
