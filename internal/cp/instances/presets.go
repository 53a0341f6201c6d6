package instances

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preset"
)

// LabelLocalWorkload marks the instances the control plane keeps for a
// host's declared local workloads; its value is the preset's name.
const LabelLocalWorkload = "drover.local-workload"

// expandPreset replaces req.Preset by the spec it expands to. Exactly one
// of spec and preset must be given.
func expandPreset(req *api.CreateInstanceRequest) []api.FieldError {
	if req.Preset == nil {
		return nil
	}
	if !reflect.ValueOf(req.Spec).IsZero() {
		return []api.FieldError{{Field: "preset", Message: "give spec or preset, not both"}}
	}
	spec, fe := preset.Expand(*req.Preset, "preset")
	if len(fe) > 0 {
		return fe
	}
	req.Spec, req.Preset = spec, nil
	return nil
}

// validatePresetField checks spec.preset, the input a preset's spec came
// from: a known preset on a container spec.
func validatePresetField(f *fieldErrs, s api.InstanceSpec) {
	if p := s.Preset; p != nil && (!slices.Contains(preset.Names(), p.Name) || s.Runtime != api.RuntimeDocker) {
		f.add("preset", "names the preset a container spec came from: one of %s", strings.Join(preset.Names(), ", "))
	}
}

// presetGPUMissing says why host h cannot give a preset's spec the GPUs
// it asks for ("" when it can, or when the spec is not a preset's): a
// host reporting no GPUs, fewer than the tensor parallel size, or not the
// index or UUID named.
func presetGPUMissing(h store.Host, spec api.InstanceSpec) string {
	if spec.Preset == nil {
		return ""
	}
	need, n := preset.NeedsGPU(*spec.Preset)
	if !need {
		return ""
	}
	var c api.Capabilities
	if len(h.Capabilities) > 0 {
		_ = json.Unmarshal(h.Capabilities, &c)
	}
	switch {
	case c.GPUCount == 0:
		return fmt.Sprintf("host %s reports no GPUs; the %s preset asks for %d (gpus none runs ollama on the CPU)", h.ID, spec.Preset.Name, n)
	case c.GPUCount < n:
		return fmt.Sprintf("host %s reports %d GPUs; the %s preset needs %d", h.ID, c.GPUCount, spec.Preset.Name, n)
	}
	if c.Inventory == nil || len(c.Inventory.GPUs) == 0 {
		return "" // indices unknown: the agent checks them
	}
	for _, g := range spec.Preset.GPUs {
		if g == api.GPUsAll || g == api.GPUsNone {
			continue
		}
		if !slices.ContainsFunc(c.Inventory.GPUs, func(x api.GPU) bool {
			return x.UUID == g || (x.Index != nil && fmt.Sprint(*x.Index) == g)
		}) {
			return fmt.Sprintf("host %s has no GPU %q (by index or UUID)", h.ID, g)
		}
	}
	return ""
}

// LocalWorkloadName is the instance name of a host's declared local
// workload: <host id>-<preset>, the host id made a DNS label.
func LocalWorkloadName(hostID, presetName string) string {
	n := strings.Map(func(r rune) rune {
		if r == '.' || r == '_' {
			return '-'
		}
		return r
	}, hostID)
	if limit := 63 - len(presetName) - 1; len(n) > limit {
		n = strings.TrimRight(n[:limit], "-")
	}
	return n + "-" + presetName
}

// SyncLocalWorkloads makes the host's instance records match the local
// workloads its agent declares (api.Capabilities.LocalWorkloads): one
// instance named LocalWorkloadName pinned to the host, created by
// "node:<id>" and labelled LabelLocalWorkload, is created, updated (its
// spec replaced, its generation bumped) or, once no longer declared,
// deleted. Problems (a bad declaration, a name taken, no room on the host)
// are logged and audited: the agent's capabilities report still succeeds.
func (s *Room) SyncLocalWorkloads(ctx context.Context, hostID string, declared []api.PresetRequest) {
	actor := "node:" + hostID
	ctx = httpapi.WithActor(ctx, actor)
	log := httpapi.Logger(ctx, s.log)
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	ins, err := s.store.ListInstances(ctx, store.InstanceFilter{HostID: hostID})
	if err != nil {
		log.Warn("local workloads not synced", "host_id", hostID, "err", err)
		return
	}
	mine := map[string]store.Instance{}
	for _, in := range ins {
		if in.CreatedBy == actor && in.Labels[LabelLocalWorkload] != "" {
			mine[in.Name] = in
		}
	}
	fail := func(name string, err error) {
		log.Warn("local workload not applied", "host_id", hostID, "name", name, "err", err)
		s.audit.Record(ctx, audit.Entry{Actor: actor, Action: "instance.local_workload", Target: name, Result: "error",
			CID: httpapi.CorrelationID(ctx), Detail: err.Error()})
	}
	want := map[string]bool{}
	for i, w := range declared {
		name := LocalWorkloadName(hostID, w.Name)
		want[name] = true
		spec, fe := preset.Expand(w, fmt.Sprintf("capabilities.local_workloads[%d]", i))
		if len(fe) > 0 {
			fail(name, fmt.Errorf("%s: %s", fe[0].Field, fe[0].Message))
			continue
		}
		if in, ok := mine[name]; ok {
			if err := s.updateLocal(ctx, in, spec); err != nil {
				fail(name, err)
			}
			continue
		}
		req := api.CreateInstanceRequest{Name: name, HostID: hostID, Labels: map[string]string{LabelLocalWorkload: w.Name}, Spec: spec}
		if fe := validateCreate(req, true); len(fe) > 0 {
			fail(name, fmt.Errorf("%s: %s", fe[0].Field, fe[0].Message))
			continue
		}
		f, err := s.loadFleet(ctx)
		if err == nil {
			_, err = s.createPlaced(ctx, f, req)
		}
		if err != nil {
			fail(name, err)
		}
	}
	for name, in := range mine {
		if !want[name] && in.DesiredState != api.DesiredDeleted {
			if _, err := s.markDeleted(ctx, in.ID); err != nil {
				fail(name, err)
			}
		}
	}
}

// updateLocal replaces a local workload's spec when the declaration
// changed (a new generation: the agent recreates the container).
func (s *Room) updateLocal(ctx context.Context, in store.Instance, spec api.InstanceSpec) error {
	b, _ := json.Marshal(spec)
	if bytes.Equal(b, in.Spec) || in.DesiredState == api.DesiredDeleted {
		return nil
	}
	out, err := s.store.UpdateInstanceRecorded(ctx, in.ID, func(i *store.Instance) error {
		if bytes.Equal(b, i.Spec) {
			return errNoChange
		}
		i.Spec, i.Generation = b, i.Generation+1
		return nil
	}, func(_, after store.Instance) store.InstanceRecords {
		ev := s.eventOf(ctx, after, httpapi.Actor(ctx), "spec updated from the agent's local workload flags")
		return store.InstanceRecords{Event: &ev, Audit: []store.AuditEvent{s.audit.Event(ctx, audit.Entry{
			Actor: httpapi.Actor(ctx), Action: "instance.update", Target: after.ID, Result: "ok",
			CID: httpapi.CorrelationID(ctx), Detail: fmt.Sprintf("name=%s generation=%d", after.Name, after.Generation)})}}
	})
	switch {
	case errors.Is(err, errNoChange):
		return nil
	case err != nil:
		return err
	}
	s.waiters.Wake(out.HostID)
	return nil
}
