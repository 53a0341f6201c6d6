// Package allocations owns the allocation routes (create, list, show,
// release under /api/v1/allocations) and the allocation state machine
// driven by the results of the user tasks (allocation.provision_user,
// allocation.deprovision_user), with a sweep that heals the host
// allocations whose task result was not handled or whose task never
// reached the store (Sweep). It must not queue tasks itself (it asks
// Tasks), resolve instances (it asks Instances) or hold terminal sessions
// (it asks Terminals to end them); all its state is in the Store.
package allocations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

// Store is what the allocations room reads and writes: the allocations,
// the host one is bound to and its user tasks. store.Store satisfies it.
type Store interface {
	store.AllocationStore
	GetHost(ctx context.Context, id string) (store.Host, error)
	GetTask(ctx context.Context, id string) (store.Task, error)
}

// Instances resolves an instance id, or else a name (an API error when
// there is none).
type Instances interface {
	Find(ctx context.Context, ref string) (store.Instance, error)
}

// Tasks builds and queues the user tasks.
type Tasks interface {
	// NewTask is a queued task created on behalf of the caller.
	NewTask(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task
	// Enqueue stores t and wakes its node.
	Enqueue(ctx context.Context, t store.Task) error
}

// Terminals ends the live terminal sessions of an allocation.
type Terminals interface {
	CloseAllocation(id string)
}

// Slices runs the slice allocations' workflow (internal/cp/sliceflow).
type Slices interface {
	// Place picks the host of n slots (hostID when given); ok is false
	// when no host has them free.
	Place(ctx context.Context, hostID string, n int) (host string, ok bool, err error)
	// Start records and runs the workflow of a slice allocation just stored.
	Start(ctx context.Context, a store.Allocation) error
	// Release releases a slice allocation through its workflow.
	Release(ctx context.Context, id string) (store.Allocation, error)
	// View is the workflow as the API shows it.
	View(ctx context.Context, id string) (*api.SliceWorkflow, error)
}

// Room serves the allocation routes.
type Room struct {
	slices    Slices
	validate  SliceValidator
	store     Store
	instances Instances
	tasks     Tasks
	terms     Terminals
	audit     *audit.Log
	registry  *task.Registry
	log       *slog.Logger
	now       func() time.Time
}

// New is the allocations room.
func New(st Store, instances Instances, tasks Tasks, terms Terminals, auditLog *audit.Log, registry *task.Registry,
	log *slog.Logger, now func() time.Time) *Room {
	return &Room{store: st, instances: instances, tasks: tasks, terms: terms, audit: auditLog, registry: registry,
		log: log, now: now}
}

// SetSlices gives the room the slice workflow; without it a slice
// allocation request is refused.
func (s *Room) SetSlices(sl Slices, validate SliceValidator) { s.slices, s.validate = sl, validate }

// errNoChange aborts an UpdateAllocation without writing.
var errNoChange = errors.New("no change")

// allocTaskTTL is how long an allocation's user task may wait in the queue
// for its node.
const allocTaskTTL = time.Hour

func allocationView(a store.Allocation) api.Allocation {
	kind := api.AllocationHost
	if a.InstanceID != "" {
		kind = api.AllocationInstance
	}
	if isSlice(a) {
		kind = api.AllocationSlice
	}
	return api.Allocation{ID: a.ID, Kind: kind, Username: a.Username, HostID: a.HostID, InstanceID: a.InstanceID,
		State: a.State, StateReason: a.StateReason, ProvisionTaskID: a.ProvisionTaskID,
		ReleaseTaskID: a.ReleaseTaskID, CreatedBy: a.CreatedBy, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
}

// Create is POST /api/v1/allocations: it binds a user to a host (queueing
// allocation.provision_user) or to an instance (active at once: its terminal
// is the serial console).
func (s *Room) Create(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var req api.CreateAllocationRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	now := s.now().UTC()
	a := store.Allocation{ID: httpapi.NewID("alc_"), Username: req.Username, CreatedBy: httpapi.Actor(ctx), CreatedAt: now, UpdatedAt: now}
	if req.Slots != 0 {
		return s.createSlice(w, r, req, a)
	}
	switch {
	case req.HostID == "" && req.InstanceID == "":
		return httpapi.Invalid([]api.FieldError{{Field: "host_id", Message: "set host_id (bare-metal user) or instance_id (VM console)"}})
	case req.HostID != "" && req.InstanceID != "":
		return httpapi.Invalid([]api.FieldError{{Field: "instance_id", Message: "set host_id or instance_id, not both"}})
	case req.InstanceID != "":
		in, err := s.instances.Find(ctx, req.InstanceID)
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
		if fe := s.registry.Validate(task.TypeAllocProvisionUser, params); len(fe) > 0 {
			return httpapi.Invalid(paramsToFields(fe))
		}
		t = s.tasks.NewTask(ctx, a.HostID, task.TypeAllocProvisionUser, params, allocTaskTTL)
		a.ProvisionTaskID = t.ID
	}
	if err := s.store.CreateAllocation(ctx, a, s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "allocation.create",
		Target: a.ID, Result: string(a.State), CID: httpapi.CorrelationID(ctx),
		Detail: fmt.Sprintf("user=%s host=%s instance=%s", a.Username, a.HostID, a.InstanceID)})); err != nil {
		return err
	}
	if t.ID != "" {
		if err := s.tasks.Enqueue(ctx, t); err != nil {
			return err
		}
	}
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

// List is GET /api/v1/allocations.
func (s *Room) List(w http.ResponseWriter, r *http.Request) error {
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

// Show is GET /api/v1/allocations/{id}.
func (s *Room) Show(w http.ResponseWriter, r *http.Request) error {
	a, err := s.store.GetAllocation(r.Context(), r.PathValue("id"))
	if err != nil {
		return httpapi.StoreError(err, "allocation", r.PathValue("id"))
	}
	v := allocationView(a)
	if isSlice(a) && s.slices != nil {
		if v.Workflow, err = s.slices.View(r.Context(), a.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, v)
	return nil
}

// Release is DELETE /api/v1/allocations/{id}: it ends an allocation: its
// open terminal sessions are closed, and a host allocation's user is removed
// by allocation.deprovision_user (released when that succeeds). Releasing
// twice is fine; releasing again an allocation whose deprovision failed,
// expired or was never queued queues it again (retryRelease).
func (s *Room) Release(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	cur, err := s.store.GetAllocation(ctx, id)
	if err == nil && isSlice(cur) && s.slices != nil {
		return s.releaseSlice(w, r, id)
	}
	retry := ""
	if err == nil && cur.State == api.AllocationReleasing {
		if retry, err = s.retryRelease(ctx, cur); err != nil {
			return err
		}
	}
	var t store.Task
	a, err := s.store.UpdateAllocationAudited(ctx, id, func(a *store.Allocation) error {
		t = store.Task{}
		switch {
		case a.State == api.AllocationReleased:
			return nil
		case a.State == api.AllocationReleasing && (retry == "" || a.ReleaseTaskID != cur.ReleaseTaskID):
			return nil
		}
		a.UpdatedAt = s.now().UTC()
		if a.InstanceID != "" {
			a.State = api.AllocationReleased
			return nil
		}
		t = s.deprovisionTask(ctx, a)
		a.State, a.StateReason, a.ReleaseTaskID = api.AllocationReleasing, "", t.ID
		return nil
	}, func(a store.Allocation) []store.AuditEvent {
		detail := ""
		if retry != "" && t.ID != "" {
			detail = "retry: " + retry
		}
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "allocation.release",
			Target: a.ID, Result: string(a.State), CID: httpapi.CorrelationID(ctx), Detail: detail})}
	})
	if err != nil {
		return httpapi.StoreError(err, "allocation", id)
	}
	if t.ID != "" {
		if err := s.tasks.Enqueue(ctx, t); err != nil {
			return err
		}
	}
	s.terms.CloseAllocation(id)
	httpapi.WriteJSON(w, http.StatusAccepted, allocationView(a))
	return nil
}

// deprovisionTask is the allocation.deprovision_user task that removes a
// host allocation's user.
func (s *Room) deprovisionTask(ctx context.Context, a *store.Allocation) store.Task {
	params, _ := json.Marshal(task.AllocDeprovisionUserParams{AllocationID: a.ID, Username: a.Username})
	return s.tasks.NewTask(ctx, a.HostID, task.TypeAllocDeprovisionUser, params, allocTaskTTL)
}

// Subscribe runs the allocation state machine on the
// results of the user tasks.
func (s *Room) Subscribe(b *taskbus.Bus) {
	b.OnFinished(task.TypeAllocProvisionUser, s.taskDone)
	b.OnFinished(task.TypeAllocDeprovisionUser, s.taskDone)
}

// taskDone moves an allocation on when its user task finishes (settle).
func (s *Room) taskDone(ctx context.Context, e taskbus.Finished) {
	t := e.Task
	var p struct {
		AllocationID string `json:"allocation_id"`
	}
	if json.Unmarshal(t.Params, &p) != nil || p.AllocationID == "" {
		return
	}
	s.settle(ctx, p.AllocationID, t, e.Result)
}
