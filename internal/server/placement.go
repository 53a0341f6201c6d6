package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/api"
	"github.com/drover-dev/drover/internal/store"
)

// shortfall lists what free lacks to hold want, e.g. "2 vCPU (need 8, free 6)".
func shortfall(free, want api.Capacity) []string {
	var short []string
	check := func(unit string, need, have int) {
		if need > have {
			short = append(short, fmt.Sprintf("%d %s (need %d, free %d)", need-have, unit, need, have))
		}
	}
	check("vCPU", want.VCPUs, free.VCPUs)
	check("MiB memory", want.MemoryMiB, free.MemoryMiB)
	check("GiB disk", want.DiskGiB, free.DiskGiB)
	check("GPU", want.GPUs, free.GPUs)
	return short
}

// placeOn picks the schedulable host with the most free memory that holds
// want, or explains per host why none does (409 insufficient_capacity).
func placeOn(hosts []store.Host, req api.PlacementRequest) (api.PlacementResponse, error) {
	var reasons []string
	var fits []api.PlacementResponse
	for _, h := range hosts {
		if req.NodeID != "" && h.ID != req.NodeID {
			continue
		}
		if !labelsMatch(h.Labels, req.Labels) {
			continue
		}
		if v := hostView(h); !v.Schedulable {
			reasons = append(reasons, fmt.Sprintf("%s: not schedulable (status %s, enabled %t)", h.ID, h.Status, h.Enabled))
			continue
		}
		var capa api.CapacityReport
		if len(h.Capacity) == 0 || json.Unmarshal(h.Capacity, &capa) != nil {
			reasons = append(reasons, h.ID+": no capacity reported yet")
			continue
		}
		if short := shortfall(capa.Free, req.Resources); len(short) > 0 {
			reasons = append(reasons, h.ID+": short "+strings.Join(short, ", "))
			continue
		}
		fits = append(fits, api.PlacementResponse{NodeID: h.ID, Free: capa.Free})
	}
	if len(fits) == 0 {
		if len(reasons) == 0 {
			reasons = []string{"no host matches node_id and labels"}
		}
		return api.PlacementResponse{}, errf(http.StatusConflict, "insufficient_capacity",
			"no host can hold the request: %s", strings.Join(reasons, "; "))
	}
	sort.SliceStable(fits, func(i, j int) bool { return fits[i].Free.MemoryMiB > fits[j].Free.MemoryMiB })
	return fits[0], nil
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// checkPlacement answers where work of a given size would go, or a 409 that
// says what is short on each candidate host.
func (s *Server) checkPlacement(w http.ResponseWriter, r *http.Request) error {
	var req api.PlacementRequest
	if err := decodeJSON(r, &req); err != nil {
		return err
	}
	rs := req.Resources
	if rs.VCPUs < 0 || rs.MemoryMiB < 0 || rs.DiskGiB < 0 || rs.GPUs < 0 {
		return invalid([]api.FieldError{{Field: "resources", Message: "amounts must be >= 0"}})
	}
	hosts, err := s.store.ListHosts(r.Context())
	if err != nil {
		return err
	}
	res, err := placeOn(hosts, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}
