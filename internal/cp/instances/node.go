package instances

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// maxInstancesWait caps the desired-set long-poll.
const maxInstancesWait = 60 * time.Second

// errStale and errRemove end an UpdateInstance without writing: the report
// is older than what is recorded, or the record is to be removed instead.
var (
	errStale  = errors.New("stale status report")
	errRemove = errors.New("remove instance")
)

// instancesETag is the hex SHA-256 of a canonical encoding of the set: the
// draining flag, then id, generation and desired state of each instance in
// id order. It changes exactly when the agent has something to act on.
func instancesETag(draining bool, ins []api.DesiredInstance) string {
	h := sha256.New()
	fmt.Fprintf(h, "draining=%t\n", draining)
	for _, in := range ins {
		fmt.Fprintf(h, "%s %d %s\n", in.ID, in.Generation, in.DesiredState)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// desiredSet reads a node's desired instance set; revoked reports a host
// revoked since the request was authorised.
func (s *Room) desiredSet(ctx context.Context, nodeID string) (set api.NodeInstances, revoked bool, err error) {
	h, err := s.store.GetHost(ctx, nodeID)
	if err != nil {
		return api.NodeInstances{}, false, err
	}
	ins, err := s.store.ListInstances(ctx, store.InstanceFilter{HostID: nodeID})
	if err != nil {
		return api.NodeInstances{}, false, err
	}
	set = api.NodeInstances{Draining: h.Draining, Instances: make([]api.DesiredInstance, 0, len(ins))}
	var devices map[string][]string // slot id → PCI addresses, read once when needed
	for _, in := range ins {
		d := api.DesiredInstance{ID: in.ID, Name: in.Name, Generation: in.Generation, DesiredState: in.DesiredState}
		if err := json.Unmarshal(in.Spec, &d.Spec); err != nil {
			return api.NodeInstances{}, false, fmt.Errorf("instance %s: decode spec: %w", in.ID, err)
		}
		if len(d.Spec.Slots) > 0 && devices == nil {
			if devices, err = s.slotDevices(ctx, nodeID); err != nil {
				return api.NodeInstances{}, false, err
			}
		}
		for _, sl := range d.Spec.Slots {
			d.PCIDevices = append(d.PCIDevices, devices[sl]...)
		}
		set.Instances = append(set.Instances, d)
	}
	sort.Slice(set.Instances, func(i, j int) bool { return set.Instances[i].ID < set.Instances[j].ID })
	set.ETag = instancesETag(set.Draining, set.Instances)
	return set, h.Revoked, nil
}

// slotDevices maps a host's approved slots to the PCI addresses they pass
// through: the GPU, then the fabric VF when the slot has one.
func (s *Room) slotDevices(ctx context.Context, hostID string) (map[string][]string, error) {
	slots, err := s.store.ListSlots(ctx, hostID)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]string, len(slots))
	for _, sl := range slots {
		var c struct {
			PCIAddress   string  `json:"pci_address"`
			FabricDevice *string `json:"fabric_device"`
		}
		if len(sl.Spec) > 0 {
			if err := json.Unmarshal(sl.Spec, &c); err != nil {
				return nil, fmt.Errorf("slot %s/%s: decode spec: %w", hostID, sl.SlotID, err)
			}
		}
		var devs []string
		if c.PCIAddress != "" {
			devs = append(devs, c.PCIAddress)
		}
		if c.FabricDevice != nil && *c.FabricDevice != "" {
			devs = append(devs, *c.FabricDevice)
		}
		out[sl.SlotID] = devs
	}
	return out, nil
}

// NodeDesired (nodeapi.DesiredInstances) returns the node's desired instance
// set. With ?etag= equal to the current one and ?wait= > 0 it long-polls: it
// sleeps until an instance or host change event for this node (never polling
// the store), then answers with the fresh set, or with the same set when the
// wait ends. On a transport that parks requests (httpapi.Parker: the framed
// node connection) it sleeps without a goroutine (desiredParked); elsewhere
// its goroutine blocks here, so its frame is kept small: the parameters and
// the answer are functions of their own.
func (s *Room) NodeDesired(w http.ResponseWriter, r *http.Request, nodeID string) error {
	if _, ok := w.(httpapi.Parker); ok {
		return s.desiredParked(w, r, nodeID)
	}
	wait, etag, err := desiredParams(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	// Register before reading, so a change committed in between still wakes us.
	wake, done := s.waiters.Add(nodeID)
	defer done()
	set, revoked, err := s.desiredSet(ctx, nodeID)
	if err != nil {
		return err
	}
	if etag != "" && etag == set.ETag && wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
	poll:
		for set.ETag == etag && !revoked {
			select {
			case <-wake:
				if set, revoked, err = s.desiredSet(ctx, nodeID); err != nil {
					return httpapi.GivenUp(r, err)
				}
			case <-timer.C:
				break poll
			case <-ctx.Done():
				return nil
			}
		}
	}
	return answerDesired(w, set, revoked)
}

// desiredParams are the desired-set long-poll's wait, ?wait= capped at
// maxInstancesWait and shortened at random (httpapi.LongPollWait), and
// the agent's ETag, ?etag=.
//
//go:noinline
func desiredParams(r *http.Request) (time.Duration, string, error) {
	q := r.URL.Query()
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return 0, "", httpapi.Invalid([]api.FieldError{{Field: "wait", Message: "must be a duration such as 30s"}})
		}
		wait = min(d, maxInstancesWait)
	}
	return httpapi.LongPollWait(wait), q.Get("etag"), nil
}

// answerDesired answers set with its ETag header, or 403 when the node was
// revoked.
//
//go:noinline
func answerDesired(w http.ResponseWriter, set api.NodeInstances, revoked bool) error {
	if revoked {
		return httpapi.Errorf(http.StatusForbidden, "node_identity_revoked", "node identity revoked")
	}
	w.Header().Set("ETag", strconv.Quote(set.ETag))
	httpapi.WriteJSON(w, http.StatusOK, set)
	return nil
}

// NodeStatus (nodeapi.InstanceStatus) records a status transition the node
// reports for one of its instances. Reports older than the recorded
// generation are ignored, identical ones change nothing, a change of phase
// or reason is also appended to the instance's events, and a Stopped
// report at or after the delete's generation removes the record of an
// instance being deleted.
func (s *Room) NodeStatus(w http.ResponseWriter, r *http.Request, nodeID string) error {
	ctx := r.Context()
	iid := r.PathValue("iid")
	var rep api.InstanceStatusReport
	if err := httpapi.DecodeJSON(r, &rep); err != nil {
		return err
	}
	var fields []api.FieldError
	if !api.ValidInstancePhase(rep.Phase) {
		fields = append(fields, api.FieldError{Field: "phase", Message: "unknown phase " + strconv.Quote(string(rep.Phase))})
	}
	if rep.ReasonCode != "" && !api.ValidReasonCode(rep.ReasonCode) {
		fields = append(fields, api.FieldError{Field: "reason_code", Message: "unknown reason code " + strconv.Quote(string(rep.ReasonCode))})
	}
	if rep.Generation < 0 {
		fields = append(fields, api.FieldError{Field: "generation", Message: "must be >= 0"})
	}
	if len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	var rt json.RawMessage
	if rep.Runtime != nil {
		rt, _ = json.Marshal(rep.Runtime)
	}
	notYours := func() error {
		s.audit.Record(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "instance.status", Target: iid, Result: "denied",
			CID: httpapi.CorrelationID(ctx), Detail: "instance not assigned to this node"})
		return httpapi.Errorf(http.StatusNotFound, "instance_not_found", "instance %q not found for node %q", iid, nodeID)
	}
	var cur store.Instance
	out, err := s.store.UpdateInstanceRecorded(ctx, iid, func(in *store.Instance) error {
		cur = *in
		switch {
		case in.HostID != nodeID:
			return store.ErrNotFound
		case rep.Generation > in.Generation:
			return httpapi.Invalid([]api.FieldError{{Field: "generation",
				Message: fmt.Sprintf("generation %d is ahead of the instance's %d", rep.Generation, in.Generation)}})
		case rep.Generation < in.ObservedGeneration:
			return errStale
		case in.DesiredState == api.DesiredDeleted && rep.Phase == api.InstanceStopped && rep.Generation >= in.Generation:
			return errRemove
		case in.Phase == rep.Phase && in.ReasonCode == rep.ReasonCode && in.Message == rep.Message &&
			in.ObservedGeneration == rep.Generation && bytes.Equal(in.Runtime, rt):
			return errNoChange
		}
		in.Phase, in.ReasonCode, in.Message, in.ObservedGeneration = rep.Phase, rep.ReasonCode, rep.Message, rep.Generation
		in.Runtime, in.StatusAt = rt, statusTime(rep.At, s.now().UTC())
		return nil
	}, func(before, after store.Instance) store.InstanceRecords {
		if after.Phase == before.Phase && after.ReasonCode == before.ReasonCode {
			return store.InstanceRecords{}
		}
		ev := s.eventOf(ctx, after, "node:"+nodeID, after.Message)
		return store.InstanceRecords{Event: &ev}
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return notYours()
	case errors.Is(err, errStale), errors.Is(err, errNoChange):
		out = cur
	case errors.Is(err, errRemove):
		removed := s.audit.Event(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "instance.delete", Target: iid, Result: "removed",
			CID: httpapi.CorrelationID(ctx), Detail: fmt.Sprintf("name=%s stopped at generation %d", cur.Name, rep.Generation)})
		if err := s.store.DeleteInstance(ctx, iid, removed); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		httpapi.Logger(ctx, s.log).Info("instance removed", "instance_id", iid, "name", cur.Name, "node_id", nodeID)
		out = cur
		out.Phase, out.ReasonCode, out.Message, out.ObservedGeneration = rep.Phase, rep.ReasonCode, rep.Message, rep.Generation
	case err != nil:
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, instanceView(out))
	return nil
}

// statusTime is when a report happened: its own time, or now.
func statusTime(at, now time.Time) time.Time {
	if at.IsZero() {
		return now
	}
	return at.UTC()
}
