package tasks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
)

// leaseSlack is added to a task type's handler timeout to get its lease.
const leaseSlack = 30 * time.Second

// Wait (nodeapi.WaitTask) long-polls for the node's next task and claims it
// atomically. It never polls the store: it claims once (not even once for a
// quiet node, see httpapi.Waiters), then sleeps until a change event for
// this node, the deadline, or the client going away. On a transport that
// parks requests (httpapi.Parker: the framed node connection) it sleeps
// without a goroutine (waitParked); elsewhere its goroutine blocks here.
//
// That goroutine parks in the select below for most of its life, so the
// frames under it are kept small: the claim, the delivery and the
// revocation check run in functions of their own (firstClaim,
// claimOnWake), whose frames are gone while it waits. A parked stack
// whose used part stays under a quarter of its size is halved by the GC
// (docs/performance.md, "Memory per idle long-poll: measured breakdown").
//
// ?max=N (at most api.MaxClaim) claims up to N of the node's tasks at once,
// each signed and audited as a single claim is: the first is the delivery,
// the rest its More.
func (s *Room) Wait(w http.ResponseWriter, r *http.Request, nodeID string) error {
	if _, ok := w.(httpapi.Parker); ok {
		return s.waitParked(w, r, nodeID)
	}
	wait, max, err := s.waitParams(r)
	if err != nil {
		return err
	}
	wake, done := s.waiters.Add(nodeID)
	defer done()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	if delivered, err := s.firstClaim(w, r, nodeID, max); delivered || err != nil {
		return err
	}
	ctxDone := r.Context().Done()
	for {
		select {
		case <-wake:
			if delivered, err := s.claimOnWake(w, r, nodeID, max); delivered || err != nil {
				return err
			}
		case <-timer.C:
			s.waiters.Settle(nodeID, wake)
			w.WriteHeader(http.StatusNoContent)
			return nil
		case <-ctxDone:
			return nil // the transport answers nothing to a request cancelled
		}
	}
}

// waitParams are the long-poll's wait, ?timeout= capped at MaxWait and
// shortened at random (httpapi.LongPollWait), and the most tasks it
// claims, ?max= (default 1) capped at api.MaxClaim.
//
//go:noinline
func (s *Room) waitParams(r *http.Request) (time.Duration, int, error) {
	q := r.URL.Query()
	wait, max := s.cfg.MaxWait, 1
	if v := q.Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return 0, 0, httpapi.Invalid([]api.FieldError{{Field: "timeout", Message: "must be a duration such as 30s"}})
		}
		wait = min(d, s.cfg.MaxWait)
	}
	if v := q.Get("max"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, 0, httpapi.Invalid([]api.FieldError{{Field: "max", Message: "must be a whole number of tasks, at least 1"}})
		}
		max = min(n, api.MaxClaim)
	}
	return httpapi.LongPollWait(wait), max, nil
}

// firstClaim is a wait's claim once its waiter is registered (delivered
// true when it wrote tasks). A quiet node (its last wait here found
// nothing, and no change event or fallback check woke it since) parks
// without a claim: nothing can have become claimable for it without a
// wake. Without the fallback check, lost events would be caught only by
// this claim: always claim.
//
//go:noinline
func (s *Room) firstClaim(w http.ResponseWriter, r *http.Request, nodeID string, max int) (bool, error) {
	if s.cfg.FallbackPoll > 0 && s.waiters.Quiet(nodeID) {
		return false, nil
	}
	return s.claimAndDeliver(w, r, nodeID, max)
}

// claimOnWake is a woken wait's claim: a 403 when the node was revoked
// meanwhile, else as claimAndDeliver.
//
//go:noinline
func (s *Room) claimOnWake(w http.ResponseWriter, r *http.Request, nodeID string, max int) (bool, error) {
	if err := s.revokedOnWake(r, nodeID); err != nil {
		return false, httpapi.GivenUp(r, err)
	}
	return s.claimAndDeliver(w, r, nodeID, max)
}

// claimAndDeliver claims up to max of the node's next tasks and, when there
// is one, writes them (delivered true).
//
//go:noinline
func (s *Room) claimAndDeliver(w http.ResponseWriter, r *http.Request, nodeID string, max int) (bool, error) {
	now := s.cfg.Now().UTC()
	ctx := r.Context()
	// The records are made inside the claim's transaction (on SQLite, on
	// the one writer's time): only what the claimed tasks decide is
	// filled in there.
	claim := s.audit.Event(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "task.claim", Result: "dispatched"})
	ts, err := s.store.ClaimTasks(ctx, nodeID, now, s.claimLeases(now), max, func(ts []store.Task) []store.AuditEvent {
		claims := make([]store.AuditEvent, len(ts))
		for i, t := range ts {
			claims[i] = claim
			claims[i].Target, claims[i].CorrelationID = t.ID, t.CorrelationID
			claims[i].Detail = "type=" + t.Type + " attempt=" + strconv.Itoa(t.Attempts)
		}
		return claims
	})
	// A claim that committed although its request was given up is
	// leased, and requeued when its lease ends, as any lost delivery.
	if err != nil || len(ts) == 0 {
		return false, httpapi.GivenUp(r, err)
	}
	return true, s.deliver(w, r, nodeID, ts)
}

// revokedOnWake is the 403 of a woken long-poll whose node was revoked
// meanwhile (nil otherwise).
//
//go:noinline
func (s *Room) revokedOnWake(r *http.Request, nodeID string) error {
	revoked, err := s.nodes.NodeRevoked(r.Context(), nodeID)
	if err != nil {
		return err
	}
	if revoked {
		return httpapi.Errorf(http.StatusForbidden, "node_identity_revoked", "node identity revoked")
	}
	return nil
}

// lease is a task type's handler timeout plus slack. The claim does not know
// the type yet, so it passes "" and gets the longest registered timeout; the
// agent's first event then sets the lease from the type's own timeout.
func (s *Room) lease(typ string) time.Duration {
	if spec, ok := s.cfg.Registry.Lookup(typ); ok && spec.Timeout > 0 {
		return spec.Timeout + leaseSlack
	}
	var longest time.Duration
	for _, t := range s.cfg.Registry.Types() {
		if spec, _ := s.cfg.Registry.Lookup(t); spec.Timeout > longest {
			longest = spec.Timeout
		}
	}
	return longest + leaseSlack
}

// claimLeases are the leases of a claim at now: each registered type's own
// (its handler timeout plus slack), the longest for any other. A claim whose
// delivery never reaches the agent (the control plane or the agent killed
// in between) is requeued after its type's lease, not the longest one.
func (s *Room) claimLeases(now time.Time) store.ClaimLeases {
	l := store.ClaimLeases{Default: now.Add(s.lease("")), ByType: map[string]time.Time{}}
	for _, typ := range s.cfg.Registry.Types() {
		if spec, _ := s.cfg.Registry.Lookup(typ); spec.Timeout > 0 {
			l.ByType[typ] = now.Add(spec.Timeout + leaseSlack)
		}
	}
	return l
}

// deliver signs claimed tasks and writes them to the agent, the first as
// the delivery and the rest as its More (their claim was recorded with the
// claim). A task that cannot be signed fails the request; the tasks stay
// dispatched and are requeued when their lease ends, as when a delivery is
// lost on the way.
func (s *Room) deliver(w http.ResponseWriter, r *http.Request, nodeID string, ts []store.Task) error {
	ds := make([]api.TaskDelivery, 0, len(ts))
	for _, t := range ts {
		d, err := s.delivery(r, nodeID, t)
		if err != nil {
			return err
		}
		ds = append(ds, d)
	}
	out := ds[0]
	if len(ds) > 1 {
		out.More = ds[1:]
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// delivery signs one claimed task and counts its dispatch (deliver audits
// it).
func (s *Room) delivery(r *http.Request, nodeID string, t store.Task) (api.TaskDelivery, error) {
	ctx := r.Context()
	// iat and exp are whole seconds and exp must be after iat: the expiry
	// is rounded up, so a task claimed in the second it expires in (a
	// terminal.open near its dispatch deadline) still gets an envelope
	// instead of a signing error.
	claims := api.TaskClaims{TaskID: t.ID, NodeID: nodeID, Type: t.Type, Params: t.Params,
		CorrelationID: t.CorrelationID, IssuedAt: s.cfg.Now().Unix(), ExpiresAt: ceilUnix(t.ExpiresAt)}
	env, err := s.signer.Sign(claims)
	if err != nil {
		return api.TaskDelivery{}, fmt.Errorf("sign task %s: %w", t.ID, err)
	}
	s.metrics.Claimed.Inc()
	s.taskDispatched(ctx, t)
	return api.TaskDelivery{TaskID: t.ID, TaskType: t.Type, Envelope: env,
		ExpiresAt: time.Unix(claims.ExpiresAt, 0).UTC(), CorrelationID: t.CorrelationID, Attempt: t.Attempts}, nil
}

// ceilUnix is t in whole seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	if t.Nanosecond() > 0 {
		return t.Unix() + 1
	}
	return t.Unix()
}

// Event (nodeapi.PostEvent) records progress and moves a dispatched task to
// running.
func (s *Room) Event(w http.ResponseWriter, r *http.Request, nodeID string) error {
	ctx := r.Context()
	var ev api.TaskEvent
	if err := httpapi.DecodeJSON(r, &ev); err != nil {
		return err
	}
	if ev.Phase == "" {
		return httpapi.Invalid([]api.FieldError{{Field: "phase", Message: "required"}})
	}
	taskID := r.PathValue("task_id")
	t, err := s.store.GetTask(ctx, taskID)
	if err != nil || t.NodeID != nodeID {
		return httpapi.Errorf(http.StatusNotFound, "task_not_found", "task %q not found for node %q", taskID, nodeID)
	}
	if ev.At.IsZero() {
		ev.At = s.cfg.Now().UTC()
	}
	if _, err := s.store.StartTask(ctx, nodeID, taskID, s.cfg.Now().UTC().Add(s.lease(t.Type))); err != nil {
		return httpapi.StoreError(err, "task", taskID)
	}
	b, _ := json.Marshal(ev)
	if err := s.store.AddTaskEvent(ctx, store.TaskEvent{TaskID: taskID, At: ev.At.UTC(), Event: b}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// Result (nodeapi.PostResult) records a task's result. The same result twice
// is fine; a different one for a finished task is a 409.
func (s *Room) Result(w http.ResponseWriter, r *http.Request, nodeID string) error {
	var res api.TaskResult
	if err := httpapi.DecodeJSON(r, &res); err != nil {
		return err
	}
	taskID := r.PathValue("task_id")
	t, err := s.complete(r.Context(), nodeID, taskID, res)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, nodeapi.ResultAck{TaskID: taskID, State: t.State})
	return nil
}

// complete checks and records one result of the node's task taskID, with
// its audit record and what the result causes.
func (s *Room) complete(ctx context.Context, nodeID, taskID string, res api.TaskResult) (store.Task, error) {
	var state api.TaskState
	switch res.Status {
	case api.ResultSucceeded:
		state = api.TaskSucceeded
	case api.ResultFailed:
		state = api.TaskFailed
		if res.Error == nil || res.Error.Code == "" {
			return store.Task{}, httpapi.Invalid([]api.FieldError{{Field: "error.code", Message: "required when status is failed"}})
		}
	default:
		return store.Task{}, httpapi.Invalid([]api.FieldError{{Field: "status", Message: `must be "succeeded" or "failed"`}})
	}
	canon, err := json.Marshal(res)
	if err != nil {
		return store.Task{}, err
	}
	sum := sha256.Sum256(canon)
	// The result's record is stored with it, so it comes before what the
	// result causes (a health probe's host.health, a workflow's next step);
	// a replay of a result already applied stores none.
	rec := s.audit.Event(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "task.result", Target: taskID})
	t, err := s.store.CompleteTask(ctx, nodeID, taskID, state, canon, hex.EncodeToString(sum[:]), s.cfg.Now().UTC(),
		func(t store.Task) []store.AuditEvent {
			rec.Result, rec.CorrelationID = string(t.State), t.CorrelationID
			return []store.AuditEvent{rec}
		})
	if err != nil {
		s.audit.Record(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "task.result", Target: taskID, Result: "refused",
			CID: res.CorrelationID, Detail: err.Error()})
		return store.Task{}, httpapi.StoreError(err, "task", taskID)
	}
	s.metrics.Results.WithLabelValues(string(t.State)).Inc()
	s.taskFinished(ctx, t)
	httpapi.Logger(ctx, s.log).Info("task result", "task_id", taskID, "node_id", nodeID, "state", t.State,
		"task_correlation_id", t.CorrelationID)
	return t, nil
}
