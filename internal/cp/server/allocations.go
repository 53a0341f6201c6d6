package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// allocTaskTTL is how long an allocation's user task may wait in the queue
// for its node.
const allocTaskTTL = time.Hour

func allocationView(a store.Allocation) api.Allocation {
	kind := api.AllocationHost
	if a.InstanceID != "" {
		kind = api.AllocationInstance
	}
	return api.Allocation{ID: a.ID, Kind: kind, Username: a.Username, HostID: a.HostID, InstanceID: a.InstanceID,
		State: a.State, StateReason: a.StateReason, ProvisionTaskID: a.ProvisionTaskID,
		ReleaseTaskID: a.ReleaseTaskID, CreatedBy: a.CreatedBy, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
}

// createAllocation binds a user to a host (queueing allocation.provision_user)
// or to an instance (active at once: its terminal is the serial console).
func (s *Server) createAllocation(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var req api.CreateAllocationRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	now := s.cfg.Now().UTC()
	a := store.Allocation{ID: httpapi.NewID("alc_"), Username: req.Username, CreatedBy: httpapi.Actor(ctx), CreatedAt: now, UpdatedAt: now}
	switch {
	case req.HostID == "" && req.InstanceID == "":
		return httpapi.Invalid([]api.FieldError{{Field: "host_id", Message: "set host_id (bare-metal user) or instance_id (VM console)"}})
	case req.HostID != "" && req.InstanceID != "":
		return httpapi.Invalid([]api.FieldError{{Field: "instance_id", Message: "set host_id or instance_id, not both"}})
	case req.InstanceID != "":
		in, err := s.findInstance(ctx, req.InstanceID)
		if err != nil {
			return err
		}
		if in.DesiredState == api.DesiredDeleted {
			return httpapi.Errorf(http.StatusConflict, "instance_deleted", "instance %q is being deleted", in.ID)
		}
		if fe := validateConsoleUser(req); fe != nil {
			return httpapi.Invalid(fe)
		}
		a.InstanceID, a.HostID, a.State = in.ID, in.HostID, api.AllocationActive
	default:
		if _, err := s.store.GetHost(ctx, req.HostID); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return httpapi.Invalid([]api.FieldError{{Field: "host_id", Message: fmt.Sprintf("no host %q", req.HostID)}})
			}
			return err
		}
		a.HostID, a.State = req.HostID, api.AllocationProvisioning
	}
	spec, _ := json.Marshal(req)
	a.Spec = spec
	var t store.Task
	if a.InstanceID == "" {
		params, _ := json.Marshal(task.AllocProvisionUserParams{AllocationID: a.ID, Username: req.Username,
			SSHAuthorizedKeys: req.SSHAuthorizedKeys, Shell: req.Shell, Sudo: req.Sudo})
		if fe := s.cfg.Registry.Validate(task.TypeAllocProvisionUser, params); len(fe) > 0 {
			return httpapi.Invalid(paramsToFields(fe))
		}
		t = s.newTask(ctx, a.HostID, task.TypeAllocProvisionUser, params, allocTaskTTL)
		a.ProvisionTaskID = t.ID
	}
	if err := s.store.CreateAllocation(ctx, a); err != nil {
		return err
	}
	if t.ID != "" {
		if err := s.enqueue(ctx, t); err != nil {
			return err
		}
	}
	s.audit.Record(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "allocation.create", Target: a.ID, Result: string(a.State),
		CID: httpapi.CorrelationID(ctx), Detail: fmt.Sprintf("user=%s host=%s instance=%s", a.Username, a.HostID, a.InstanceID)})
	httpapi.WriteJSON(w, http.StatusCreated, allocationView(a))
	return nil
}

// validateConsoleUser checks an instance allocation's request: the user
// names the person, and there is no OS user to provision on the host.
func validateConsoleUser(req api.CreateAllocationRequest) []api.FieldError {
	if req.Username == "" {
		return []api.FieldError{{Field: "username", Message: "is required"}}
	}
	if msg := task.UsernameProblem(req.Username); msg != "" {
		return []api.FieldError{{Field: "username", Message: msg}}
	}
	if len(req.SSHAuthorizedKeys) > 0 || req.Shell != "" || req.Sudo {
		return []api.FieldError{{Field: "ssh_authorized_keys",
			Message: "an instance allocation opens the serial console; keys, shell and sudo apply to host allocations only"}}
	}
	return nil
}

// paramsToFields maps task param errors ("params.username") to request
// fields ("username").
func paramsToFields(fe []api.FieldError) []api.FieldError {
	out := make([]api.FieldError, len(fe))
	for i, f := range fe {
		f.Field, _ = strings.CutPrefix(f.Field, "params.")
		out[i] = f
	}
	return out
}

// newTask builds a queued task created by the control plane on behalf of
// the caller.
func (s *Server) newTask(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task {
	now := s.cfg.Now().UTC()
	return store.Task{ID: httpapi.NewID("tsk_"), NodeID: nodeID, Type: typ, Params: params, State: api.TaskQueued,
		CorrelationID: httpapi.CorrelationID(ctx), CreatedBy: orSystem(httpapi.Actor(ctx)), CreatedAt: now, ExpiresAt: now.Add(ttl)}
}

// enqueue stores t, wakes its node's long-poll on this replica and audits.
func (s *Server) enqueue(ctx context.Context, t store.Task) error {
	if err := s.store.EnqueueTask(ctx, t); err != nil {
		return err
	}
	s.waiters.wake(t.NodeID)
	s.metrics.tasksEnqueued.Inc()
	s.audit.Record(ctx, audit.Entry{Actor: t.CreatedBy, Action: "task.enqueue", Target: t.ID, Result: "queued",
		CID: t.CorrelationID, Detail: "node=" + t.NodeID + " type=" + t.Type})
	return nil
}

func (s *Server) listAllocations(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	as, err := s.store.ListAllocations(r.Context(), store.AllocationFilter{HostID: q.Get("host_id"),
		InstanceID: q.Get("instance_id"), State: api.AllocationState(q.Get("state"))})
	if err != nil {
		return err
	}
	out := make([]api.Allocation, 0, len(as))
	for _, a := range as {
		out = append(out, allocationView(a))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showAllocation(w http.ResponseWriter, r *http.Request) error {
	a, err := s.store.GetAllocation(r.Context(), r.PathValue("id"))
	if err != nil {
		return httpapi.StoreError(err, "allocation", r.PathValue("id"))
	}
	httpapi.WriteJSON(w, http.StatusOK, allocationView(a))
	return nil
}

// releaseAllocation ends an allocation: its open terminal sessions are
// closed, and a host allocation's user is removed by
// allocation.deprovision_user (released when that succeeds). Releasing
// twice is fine.
func (s *Server) releaseAllocation(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	var t store.Task
	a, err := s.store.UpdateAllocation(ctx, id, func(a *store.Allocation) error {
		if a.State == api.AllocationReleasing || a.State == api.AllocationReleased {
			return nil
		}
		a.UpdatedAt = s.cfg.Now().UTC()
		if a.InstanceID != "" {
			a.State = api.AllocationReleased
			return nil
		}
		params, _ := json.Marshal(task.AllocDeprovisionUserParams{AllocationID: a.ID, Username: a.Username})
		t = s.newTask(ctx, a.HostID, task.TypeAllocDeprovisionUser, params, allocTaskTTL)
		a.State, a.ReleaseTaskID = api.AllocationReleasing, t.ID
		return nil
	})
	if err != nil {
		return httpapi.StoreError(err, "allocation", id)
	}
	if t.ID != "" {
		if err := s.enqueue(ctx, t); err != nil {
			return err
		}
	}
	s.term.CloseAllocation(id)
	s.audit.Record(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "allocation.release", Target: a.ID, Result: string(a.State),
		CID: httpapi.CorrelationID(ctx)})
	httpapi.WriteJSON(w, http.StatusAccepted, allocationView(a))
	return nil
}

// subscribeAllocationTasks runs the allocation state machine on the
// results of the user tasks.
func (s *Server) subscribeAllocationTasks(b *taskbus.Bus) {
	b.OnFinished(task.TypeAllocProvisionUser, s.allocationTaskDone)
	b.OnFinished(task.TypeAllocDeprovisionUser, s.allocationTaskDone)
}

// allocationTaskDone moves an allocation on when its user task finishes:
// provision succeeded → active, failed → failed; deprovision succeeded →
// released (a failed deprovision stays releasing, with the reason, for an
// operator to retry).
func (s *Server) allocationTaskDone(ctx context.Context, e taskbus.Finished) {
	t := e.Task
	var p struct {
		AllocationID string `json:"allocation_id"`
	}
	if json.Unmarshal(t.Params, &p) != nil || p.AllocationID == "" {
		return
	}
	reason := ""
	if t.State != api.TaskSucceeded {
		reason = string(t.State)
		if e.Result != nil && e.Result.Error != nil {
			reason = e.Result.Error.Code + ": " + e.Result.Error.Message
		}
	}
	a, err := s.store.UpdateAllocation(ctx, p.AllocationID, func(a *store.Allocation) error {
		switch {
		case t.Type == task.TypeAllocProvisionUser && t.ID == a.ProvisionTaskID && a.State == api.AllocationProvisioning:
			a.State, a.StateReason = api.AllocationActive, ""
			if reason != "" {
				a.State, a.StateReason = api.AllocationFailed, reason
			}
		case t.Type == task.TypeAllocDeprovisionUser && t.ID == a.ReleaseTaskID && a.State == api.AllocationReleasing:
			a.State, a.StateReason = api.AllocationReleased, ""
			if reason != "" {
				a.State, a.StateReason = api.AllocationReleasing, reason
			}
		default:
			return errNoChange
		}
		a.UpdatedAt = s.cfg.Now().UTC()
		return nil
	})
	if errors.Is(err, errNoChange) {
		return
	}
	if err != nil {
		s.log.Warn("allocation task result", "allocation_id", p.AllocationID, "task_id", t.ID, "err", err,
			"correlation_id", t.CorrelationID)
		return
	}
	s.audit.Record(ctx, audit.Entry{Actor: "system", Action: "allocation.state", Target: a.ID, Result: string(a.State),
		CID: t.CorrelationID, Detail: "task=" + t.ID + " " + reason})
}
