package instances

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// maxPlacementAttempts bounds create-verify rounds lost to another replica.
const maxPlacementAttempts = 3

// newInstanceID returns "i-" and 12 random lowercase hex digits.
func newInstanceID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return "i-" + hex.EncodeToString(b[:])
}

// instanceView converts an instance record to its API form.
func instanceView(in store.Instance) api.Instance {
	v := api.Instance{ID: in.ID, Name: in.Name, Group: in.Group, HostID: in.HostID, Labels: in.Labels,
		DesiredState: in.DesiredState, Generation: in.Generation, Phase: in.Phase, ReasonCode: in.ReasonCode,
		Message: in.Message, ObservedGeneration: in.ObservedGeneration, CreatedBy: in.CreatedBy,
		CreatedAt: in.CreatedAt, UpdatedAt: in.UpdatedAt}
	_ = json.Unmarshal(in.Spec, &v.Spec)
	if len(in.Runtime) > 0 {
		var rt api.InstanceRuntime
		if json.Unmarshal(in.Runtime, &rt) == nil {
			v.Runtime = &rt
		}
	}
	if !in.StatusAt.IsZero() {
		at := in.StatusAt
		v.StatusAt = &at
	}
	return v
}

// Find resolves an instance id, or else a name.
func (s *Room) Find(ctx context.Context, ref string) (store.Instance, error) {
	in, err := s.store.GetInstance(ctx, ref)
	if errors.Is(err, store.ErrNotFound) {
		in, err = s.store.GetInstanceByName(ctx, ref)
	}
	if err != nil {
		return store.Instance{}, httpapi.StoreError(err, "instance", ref)
	}
	return in, nil
}

// Create (POST /api/v1/instances) validates, places and records one instance
// (201).
func (s *Room) Create(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var req api.CreateInstanceRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if fields := expandPreset(&req); len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	if fields := validateCreate(req, true); len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	f, err := s.loadFleet(ctx)
	if err != nil {
		return err
	}
	in, err := s.createPlaced(ctx, f, req)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusCreated, instanceView(in))
	return nil
}

// createPlaced places req (named req.Name) on a host of f, inserts it and
// checks that no other replica's concurrent placement overcommitted the
// host; the loser of such a race removes its record and places again.
// f is updated with the new instance. The caller holds s.placeMu.
func (s *Room) createPlaced(ctx context.Context, f *fleet, req api.CreateInstanceRequest) (store.Instance, error) {
	if f.names[req.Name] {
		return store.Instance{}, httpapi.Errorf(http.StatusConflict, "instance_exists", "an instance named %q exists", req.Name)
	}
	spec, _ := json.Marshal(req.Spec)
	for attempt := 1; ; attempt++ {
		hostID, err := s.pickHost(ctx, f, req)
		if err != nil {
			return store.Instance{}, err
		}
		now := s.now().UTC()
		in := store.Instance{ID: newInstanceID(), Name: req.Name, Group: req.Group, HostID: hostID, Labels: req.Labels,
			Spec: spec, DesiredState: api.DesiredRunning, Generation: 1, Phase: api.InstancePending,
			CreatedBy: httpapi.Actor(ctx), CreatedAt: now, UpdatedAt: now}
		// The record goes with the instance: a node may see it at once. A
		// lost placement race below deletes it with a record of its own.
		created := s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "instance.create", Target: in.ID, Result: "ok",
			CID: httpapi.CorrelationID(ctx), Detail: fmt.Sprintf("name=%s host=%s group=%s", in.Name, hostID, in.Group)})
		if err := s.store.CreateInstanceRecorded(ctx, in, s.eventOf(ctx, in, httpapi.Actor(ctx), "created on host "+hostID), created); err != nil {
			if errors.Is(err, store.ErrConflict) {
				return store.Instance{}, httpapi.Errorf(http.StatusConflict, "instance_exists", "an instance named %q exists", req.Name)
			}
			return store.Instance{}, err
		}
		ok, err := s.verifyPlacement(ctx, in.ID, hostID, req.Spec)
		if err == nil && ok {
			s.waiters.Wake(hostID) // same replica: do not wait for the event round trip
			f.add(hostID, in.Name, in.DesiredState, req.Spec)
			return in, nil
		}
		why := "placement_lost"
		if err != nil {
			why = "placement_unverified"
		}
		removed := s.audit.Event(ctx, audit.Entry{Actor: "system", Action: "instance.delete", Target: in.ID, Result: why,
			CID: httpapi.CorrelationID(ctx), Detail: fmt.Sprintf("name=%s host=%s attempt=%d", in.Name, hostID, attempt)})
		if derr := s.store.DeleteInstance(context.WithoutCancel(ctx), in.ID, removed); derr != nil && !errors.Is(derr, store.ErrNotFound) {
			return store.Instance{}, errors.Join(err, derr)
		}
		if err != nil {
			return store.Instance{}, err
		}
		if attempt == maxPlacementAttempts {
			return store.Instance{}, &httpapi.Error{Status: http.StatusConflict, RetryAfter: 1, CodedError: api.CodedError{
				Code: "placement_conflict", Message: "concurrent placements kept taking the same capacity; retry"}}
		}
		if f, err = s.loadFleet(ctx); err != nil {
			return store.Instance{}, err
		}
	}
}

// pickHost chooses the host for req: req.HostID when it can take it, or
// the best host matching req.HostLabels.
func (s *Room) pickHost(ctx context.Context, f *fleet, req api.CreateInstanceRequest) (string, error) {
	if req.HostID != "" && !slices.ContainsFunc(f.hosts, func(h store.Host) bool { return h.ID == req.HostID }) {
		return "", httpapi.Invalid([]api.FieldError{{Field: "host_id", Message: "no host " + strconv.Quote(req.HostID)}})
	}
	if req.HostID != "" {
		if h := f.host(req.HostID); h != nil {
			if why := runtimeMissing(*h, req.Spec); why != "" {
				return "", httpapi.Invalid([]api.FieldError{{Field: "spec.runtime", Message: why + " on host " + req.HostID}})
			}
			if why, field := gpuConflict(*h, req.Spec, nil); field != "" {
				return "", httpapi.Invalid([]api.FieldError{{Field: field, Message: why + " (host " + req.HostID + ")"}})
			}
			if why := presetGPUMissing(*h, req.Spec); why != "" {
				return "", httpapi.Invalid([]api.FieldError{{Field: "preset.gpus", Message: why}})
			}
		}
	}
	var check slotCheck
	if len(req.Spec.Slots) > 0 {
		approved := map[string]map[string]bool{}
		for _, h := range f.hosts {
			if (req.HostID != "" && h.ID != req.HostID) || !labelsMatch(h.Labels, req.HostLabels) {
				continue
			}
			sl, err := s.store.ListSlots(ctx, h.ID)
			if err != nil {
				return "", err
			}
			approved[h.ID] = map[string]bool{}
			for _, x := range sl {
				approved[h.ID][x.SlotID] = true
			}
		}
		check = func(h store.Host) string {
			for _, sl := range req.Spec.Slots {
				if !approved[h.ID][sl] {
					return fmt.Sprintf("slot %s is not approved", sl)
				}
				if holder := f.slots[h.ID][sl]; holder != "" {
					return fmt.Sprintf("slot %s is held by instance %s", sl, holder)
				}
			}
			return ""
		}
	}
	if req.Spec.Runtime != "" {
		slots := check
		check = func(h store.Host) string {
			if why := runtimeMissing(h, req.Spec); why != "" {
				return why
			}
			if why, _ := gpuConflict(h, req.Spec, f.gpus[h.ID]); why != "" {
				return why
			}
			if slots != nil {
				return slots(h)
			}
			return ""
		}
	}
	if req.Spec.Preset != nil {
		prev := check
		check = func(h store.Host) string {
			if why := presetGPUMissing(h, req.Spec); why != "" {
				return why
			}
			if prev != nil {
				return prev(h)
			}
			return ""
		}
	}
	res, err := f.place(api.PlacementRequest{NodeID: req.HostID, Labels: req.HostLabels, Resources: req.Spec.Resources()}, check)
	if err != nil {
		return "", err
	}
	return res.NodeID, nil
}

// verifyPlacement re-checks, with instance id recorded, that its host is not
// overcommitted and that no other record holds its slots. Within a replica
// placeMu makes this always true; it settles races between replicas (both
// losers retry, the survivors stand).
func (s *Room) verifyPlacement(ctx context.Context, id, hostID string, spec api.InstanceSpec) (bool, error) {
	h, err := s.store.GetHost(ctx, hostID)
	if err != nil {
		return false, err
	}
	ins, err := s.store.ListInstances(ctx, store.InstanceFilter{HostID: hostID})
	if err != nil {
		return false, err
	}
	var used api.Capacity
	held := map[string]bool{}
	for _, in := range ins {
		var sp api.InstanceSpec
		if err := json.Unmarshal(in.Spec, &sp); err != nil {
			return false, fmt.Errorf("instance %s: decode spec: %w", in.ID, err)
		}
		if in.DesiredState != api.DesiredDeleted {
			used = addCapacity(used, sp.Resources())
		}
		if in.ID != id {
			for _, sl := range sp.Slots {
				held[sl] = true
			}
		}
	}
	free, ok := freeOf(h, used, s.cpuRatio)
	if !ok || free.VCPUs < 0 || free.MemoryMiB < 0 || free.DiskGiB < 0 || free.GPUs < 0 {
		return false, nil
	}
	for _, sl := range spec.Slots {
		if held[sl] {
			return false, nil
		}
	}
	return true, nil
}

// List is GET /api/v1/instances.
func (s *Room) List(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	ins, err := s.store.ListInstances(r.Context(), store.InstanceFilter{HostID: q.Get("host"), Group: q.Get("group")})
	if err != nil {
		return err
	}
	out := make([]api.Instance, 0, len(ins))
	for _, in := range ins {
		out = append(out, instanceView(in))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// Show is GET /api/v1/instances/{id}.
func (s *Room) Show(w http.ResponseWriter, r *http.Request) error {
	in, err := s.Find(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, instanceView(in))
	return nil
}

// SetDesired is stop and start: the desired state changes and the
// generation is bumped. Asking again for the state an instance already has
// changes nothing, except start on a Failed instance, whose new generation
// asks its agent to try again.
func (s *Room) SetDesired(desired api.DesiredState) httpapi.HandlerFunc {
	action := "instance.stop"
	if desired == api.DesiredRunning {
		action = "instance.start"
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		ctx := r.Context()
		in, err := s.Find(ctx, r.PathValue("id"))
		if err != nil {
			return err
		}
		var cur store.Instance
		out, err := s.store.UpdateInstanceRecorded(ctx, in.ID, func(i *store.Instance) error {
			cur = *i
			switch {
			case i.DesiredState == api.DesiredDeleted:
				return httpapi.Errorf(http.StatusConflict, "instance_deleting", "instance %s is being deleted", i.Name)
			case i.DesiredState == desired && (desired != api.DesiredRunning || i.Phase != api.InstanceFailed):
				return errNoChange
			}
			i.DesiredState, i.Generation = desired, i.Generation+1
			return nil
		}, func(before, after store.Instance) store.InstanceRecords {
			ev := s.eventOf(ctx, after, httpapi.Actor(ctx), fmt.Sprintf("desired state %s (was %s)", desired, before.DesiredState))
			return store.InstanceRecords{Event: &ev, Audit: []store.AuditEvent{s.audit.Event(ctx, desiredEntry(ctx, action, after, "ok"))}}
		})
		switch {
		case errors.Is(err, errNoChange):
			s.audit.Record(ctx, desiredEntry(ctx, action, cur, "unchanged"))
			out = cur
		case err != nil:
			return httpapi.StoreError(err, "instance", in.ID)
		default:
			s.waiters.Wake(out.HostID)
		}
		httpapi.WriteJSON(w, http.StatusOK, instanceView(out))
		return nil
	}
}

// Delete (DELETE /api/v1/instances/{id}) asks the agent to stop and destroy
// the instance (202); the record goes when the agent reports it Stopped at
// the delete's generation. ?force=true removes the record at once (for a
// host that is gone).
func (s *Room) Delete(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	force := false
	if v := r.URL.Query().Get("force"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return httpapi.Invalid([]api.FieldError{{Field: "force", Message: "must be true or false"}})
		}
		force = b
	}
	in, err := s.Find(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	if force {
		forced := s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "instance.delete", Target: in.ID, Result: "forced",
			CID: httpapi.CorrelationID(ctx), Detail: "name=" + in.Name + " host=" + in.HostID})
		if err := s.store.DeleteInstance(ctx, in.ID, forced); err != nil {
			return httpapi.StoreError(err, "instance", in.ID)
		}
		s.waiters.Wake(in.HostID)
		httpapi.WriteJSON(w, http.StatusOK, instanceView(in))
		return nil
	}
	out, err := s.markDeleted(ctx, in.ID)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusAccepted, instanceView(out))
	return nil
}

// desiredEntry is the audit record of an operator's change of an
// instance's desired state (result "ok", or "unchanged" when it already
// was), naming its generation.
func desiredEntry(ctx context.Context, action string, in store.Instance, result string) audit.Entry {
	return audit.Entry{Actor: httpapi.Actor(ctx), Action: action, Target: in.ID, Result: result, CID: httpapi.CorrelationID(ctx),
		Detail: fmt.Sprintf("name=%s generation=%d", in.Name, in.Generation)}
}

// markDeleted sets desired deleted (bumping the generation unless it was
// already set) and audits it.
func (s *Room) markDeleted(ctx context.Context, id string) (store.Instance, error) {
	var cur store.Instance
	out, err := s.store.UpdateInstanceRecorded(ctx, id, func(i *store.Instance) error {
		cur = *i
		if i.DesiredState == api.DesiredDeleted {
			return errNoChange
		}
		i.DesiredState, i.Generation = api.DesiredDeleted, i.Generation+1
		return nil
	}, func(before, after store.Instance) store.InstanceRecords {
		ev := s.eventOf(ctx, after, httpapi.Actor(ctx), fmt.Sprintf("desired state %s (was %s)", api.DesiredDeleted, before.DesiredState))
		return store.InstanceRecords{Event: &ev, Audit: []store.AuditEvent{s.audit.Event(ctx, desiredEntry(ctx, "instance.delete", after, "ok"))}}
	})
	switch {
	case errors.Is(err, errNoChange):
		s.audit.Record(ctx, desiredEntry(ctx, "instance.delete", cur, "unchanged"))
		out = cur
	case err != nil:
		return store.Instance{}, httpapi.StoreError(err, "instance", id)
	default:
		s.waiters.Wake(out.HostID)
	}
	return out, nil
}

// instanceSuffix is n of "<group>-<n>", or -1.
func instanceSuffix(group, name string) int {
	rest, ok := strings.CutPrefix(name, group+"-")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || strconv.Itoa(n) != rest {
		return -1
	}
	return n
}
