package instances

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// fleet is what placement decides on: the hosts, what the instances assigned
// to each already take, and which slots they hold. Free capacity is computed
// here, not taken from the agent's report: total − reserved (from the host's
// last capacity report) − the resources of every instance on the host whose
// desired state is not deleted, so an instance counts from the moment it is
// created, before any agent has started it.
type fleet struct {
	hosts []store.Host
	used  map[string]api.Capacity // host id → resources of its instances not desired deleted
	// slots: host id → slot id → name of the instance holding it. Every
	// instance record holds its slots until it is removed (a device cannot
	// be passed to a new VM while the deleted one may still run).
	slots map[string]map[string]string
	names map[string]bool // every instance name in use
	// gpus: host id → GPU as a container names it ("0", "GPU-…") → name
	// of the instance holding it (containers not desired deleted).
	gpus map[string]map[string]string
	// cpuRatio is the vCPU allocation ratio (Config.VCPUAllocationRatio);
	// 0 means 1.
	cpuRatio float64
}

// loadFleet reads hosts and instances.
func (s *Room) loadFleet(ctx context.Context) (*fleet, error) {
	hosts, err := s.store.ListHosts(ctx)
	if err != nil {
		return nil, err
	}
	ins, err := s.store.ListInstances(ctx, store.InstanceFilter{})
	if err != nil {
		return nil, err
	}
	f := &fleet{hosts: hosts, used: map[string]api.Capacity{}, slots: map[string]map[string]string{}, names: map[string]bool{},
		cpuRatio: s.cpuRatio}
	for _, in := range ins {
		var spec api.InstanceSpec
		if err := json.Unmarshal(in.Spec, &spec); err != nil {
			return nil, fmt.Errorf("instance %s: decode spec: %w", in.ID, err)
		}
		f.add(in.HostID, in.Name, in.DesiredState, spec)
	}
	return f, nil
}

// add counts an instance on hostID.
func (f *fleet) add(hostID, name string, desired api.DesiredState, spec api.InstanceSpec) {
	f.names[name] = true
	if desired != api.DesiredDeleted {
		f.used[hostID] = addCapacity(f.used[hostID], spec.Resources())
	}
	if c := spec.Container; c != nil && desired != api.DesiredDeleted {
		for _, g := range c.GPUs {
			if f.gpus == nil {
				f.gpus = map[string]map[string]string{}
			}
			if f.gpus[hostID] == nil {
				f.gpus[hostID] = map[string]string{}
			}
			f.gpus[hostID][g] = name
		}
	}
	for _, sl := range spec.Slots {
		if f.slots[hostID] == nil {
			f.slots[hostID] = map[string]string{}
		}
		f.slots[hostID][sl] = name
	}
}

// host is the fleet's host id, nil when there is none.
func (f *fleet) host(id string) *store.Host {
	for i := range f.hosts {
		if f.hosts[i].ID == id {
			return &f.hosts[i]
		}
	}
	return nil
}

// clone returns a copy that can be planned on without changing f.
func (f *fleet) clone() *fleet {
	c := &fleet{hosts: f.hosts, used: maps.Clone(f.used), slots: map[string]map[string]string{}, names: maps.Clone(f.names),
		cpuRatio: f.cpuRatio}
	for h, m := range f.slots {
		c.slots[h] = maps.Clone(m)
	}
	for h, m := range f.gpus {
		if c.gpus == nil {
			c.gpus = map[string]map[string]string{}
		}
		c.gpus[h] = maps.Clone(m)
	}
	return c
}

func addCapacity(a, b api.Capacity) api.Capacity {
	return api.Capacity{VCPUs: a.VCPUs + b.VCPUs, MemoryMiB: a.MemoryMiB + b.MemoryMiB,
		DiskGiB: a.DiskGiB + b.DiskGiB, GPUs: a.GPUs + b.GPUs}
}

// freeOf is total − reserved − used, with the host's vCPUs (after the
// reservation) multiplied by cpuRatio (vCPUs are time-shared; memory, disk
// and GPUs are not overcommitted); ok is false when the host has not
// reported capacity yet. Amounts may be negative on an overcommitted host.
func freeOf(h store.Host, used api.Capacity, cpuRatio float64) (api.Capacity, bool) {
	var capa api.CapacityReport
	if len(h.Capacity) == 0 || json.Unmarshal(h.Capacity, &capa) != nil {
		return api.Capacity{}, false
	}
	if cpuRatio <= 0 {
		cpuRatio = 1
	}
	t, r := capa.Total, capa.Reserved
	vcpus := int(float64(t.VCPUs-r.VCPUs) * cpuRatio)
	return api.Capacity{VCPUs: vcpus - used.VCPUs, MemoryMiB: t.MemoryMiB - r.MemoryMiB - used.MemoryMiB,
		DiskGiB: t.DiskGiB - r.DiskGiB - used.DiskGiB, GPUs: t.GPUs - r.GPUs - used.GPUs}, true
}

func clampFree(c api.Capacity) api.Capacity {
	return api.Capacity{VCPUs: max(0, c.VCPUs), MemoryMiB: max(0, c.MemoryMiB), DiskGiB: max(0, c.DiskGiB), GPUs: max(0, c.GPUs)}
}

// shortfall lists what free lacks to hold want, e.g. "2 vCPU (need 8, free 6)".
func shortfall(free, want api.Capacity) []string {
	free = clampFree(free)
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

// slotCheck is an extra placement condition: it returns why host h cannot
// give the request its slots, or "" when it can.
type slotCheck func(h store.Host) string

// place picks the schedulable, non-draining host with the most free memory
// that holds req (on req.NodeID only, when set) and passes slots (nil: no
// slot condition), or explains per host why none does: 409
// insufficient_capacity, or slot_unavailable when some host had room but
// not the slots.
func (f *fleet) place(req api.PlacementRequest, slots slotCheck) (api.PlacementResponse, error) {
	var reasons []string
	var fits []api.PlacementResponse
	slotShort := false
	for _, h := range f.hosts {
		if req.NodeID != "" && h.ID != req.NodeID {
			continue
		}
		if !labelsMatch(h.Labels, req.Labels) {
			continue
		}
		if h.Draining {
			reasons = append(reasons, h.ID+": draining")
			continue
		}
		if !Schedulable(h) {
			reasons = append(reasons, fmt.Sprintf("%s: not schedulable (status %s, enabled %t)", h.ID, h.Status, h.Enabled))
			continue
		}
		free, ok := freeOf(h, f.used[h.ID], f.cpuRatio)
		if !ok {
			reasons = append(reasons, h.ID+": no capacity reported yet")
			continue
		}
		if short := shortfall(free, req.Resources); len(short) > 0 {
			reasons = append(reasons, h.ID+": short "+strings.Join(short, ", "))
			continue
		}
		if slots != nil {
			if why := slots(h); why != "" {
				reasons = append(reasons, h.ID+": "+why)
				slotShort = true
				continue
			}
		}
		fits = append(fits, api.PlacementResponse{NodeID: h.ID, Free: clampFree(free)})
	}
	if len(fits) == 0 {
		if len(reasons) == 0 {
			reasons = []string{"no host matches node_id and labels"}
		}
		code := "insufficient_capacity"
		if slotShort {
			code = "slot_unavailable"
		}
		return api.PlacementResponse{}, httpapi.Errorf(http.StatusConflict, code,
			"no host can hold the request: %s", strings.Join(reasons, "; "))
	}
	sort.SliceStable(fits, func(i, j int) bool { return fits[i].Free.MemoryMiB > fits[j].Free.MemoryMiB })
	return fits[0], nil
}

// Schedulable is whether a host may take new instances: enabled, not
// revoked or draining, healthy, and its accelerator without an error (the
// host view's schedulable flag).
func Schedulable(h store.Host) bool {
	if !h.Enabled || h.Revoked || h.Draining || h.Status != api.HostHealthy {
		return false
	}
	if len(h.Capabilities) > 0 {
		var c api.Capabilities
		if json.Unmarshal(h.Capabilities, &c) == nil && c.AccelError != "" {
			return false
		}
	}
	return true
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// CheckPlacement (POST /api/v1/placements/check) answers where work of a
// given size would go, or a 409 that says what is short on each candidate
// host. It counts instances exactly as instance placement does.
func (s *Room) CheckPlacement(w http.ResponseWriter, r *http.Request) error {
	var req api.PlacementRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	rs := req.Resources
	if rs.VCPUs < 0 || rs.MemoryMiB < 0 || rs.DiskGiB < 0 || rs.GPUs < 0 {
		return httpapi.Invalid([]api.FieldError{{Field: "resources", Message: "amounts must be >= 0"}})
	}
	f, err := s.loadFleet(r.Context())
	if err != nil {
		return err
	}
	res, err := f.place(req, nil)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, res)
	return nil
}
