package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

const (
	defaultTaskTTL = 10 * time.Minute
	maxTaskTTL     = 24 * time.Hour
)

// View converts a task to its API form (the task routes and evidence
// bundles use it).
func View(t store.Task) api.Task {
	v := api.Task{ID: t.ID, NodeID: t.NodeID, Type: t.Type, Params: t.Params, State: t.State,
		CorrelationID: t.CorrelationID, Attempts: t.Attempts, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt,
		CreatedBy: t.CreatedBy}
	if !t.DispatchedAt.IsZero() {
		d := t.DispatchedAt
		v.DispatchedAt = &d
	}
	if !t.FinishedAt.IsZero() {
		f := t.FinishedAt
		v.FinishedAt = &f
	}
	if len(t.Result) > 0 {
		var res api.TaskResult
		if json.Unmarshal(t.Result, &res) == nil {
			v.Result = &res
		}
	}
	return v
}

// Envelope is t's signed envelope metadata, with kid the key signing now
// (GET /api/v1/tasks/{id} and evidence bundles).
func Envelope(t store.Task, kid string) *api.TaskEnvelope {
	e := &api.TaskEnvelope{KID: kid, Expires: t.ExpiresAt.Unix(), Audience: t.NodeID}
	if !t.DispatchedAt.IsZero() {
		e.IssuedAt = t.DispatchedAt.Unix()
	}
	return e
}

// Create (POST /api/v1/tasks) validates and queues a task for one node.
func (s *Room) Create(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var req api.EnqueueTaskRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	t, fields, err := s.prepare(ctx, req, s.cfg.Now().UTC(), map[string]bool{})
	if err != nil {
		return err
	}
	if len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	if err := s.Enqueue(ctx, t); err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusCreated, View(t))
	return nil
}

// prepare validates an enqueue request and builds its queued task; fields
// are the request's errors. hosts caches which node ids exist (a batch
// names the same nodes many times).
func (s *Room) prepare(ctx context.Context, req api.EnqueueTaskRequest, now time.Time, hosts map[string]bool) (store.Task, []api.FieldError, error) {
	var fields []api.FieldError
	if req.NodeID == "" {
		fields = append(fields, api.FieldError{Field: "node_id", Message: "required"})
	} else if known, ok := hosts[req.NodeID]; !ok {
		_, err := s.store.GetHost(ctx, req.NodeID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return store.Task{}, nil, fmt.Errorf("enqueue task for %s (correlation id %s): %w", req.NodeID, httpapi.CorrelationID(ctx), err)
		}
		hosts[req.NodeID] = err == nil
		if err != nil {
			fields = append(fields, api.FieldError{Field: "node_id", Message: "no host " + strconv.Quote(req.NodeID)})
		}
	} else if !known {
		fields = append(fields, api.FieldError{Field: "node_id", Message: "no host " + strconv.Quote(req.NodeID)})
	}
	if len(req.Params) == 0 || string(req.Params) == "null" {
		req.Params = json.RawMessage("{}")
	}
	if spec, ok := s.cfg.Registry.Lookup(req.Type); ok && spec.Internal {
		fields = append(fields, api.FieldError{Field: "type",
			Message: fmt.Sprintf("task type %q is created by the control plane itself (the terminal gateway), not by operators", req.Type)})
	} else if fe := s.cfg.Registry.Validate(req.Type, req.Params); len(fe) > 0 {
		fields = append(fields, fe...)
	} else if len(fields) == 0 { // the host exists: slice tasks may name only its approved slots
		fe, err := s.slots.SliceSlotFields(ctx, req.NodeID, req.Type, req.Params)
		if err != nil {
			return store.Task{}, nil, fmt.Errorf("enqueue task for %s (correlation id %s): %w", req.NodeID, httpapi.CorrelationID(ctx), err)
		}
		fields = append(fields, fe...)
	}
	expires := now.Add(defaultTaskTTL)
	switch {
	case req.TTL != 0 && req.ExpiresAt != nil:
		fields = append(fields, api.FieldError{Field: "ttl", Message: "set ttl or expires_at, not both"})
	case req.TTL != 0:
		if d := time.Duration(req.TTL); d < time.Second || d > maxTaskTTL {
			fields = append(fields, api.FieldError{Field: "ttl", Message: "must be between 1s and 24h"})
		} else {
			expires = now.Add(d)
		}
	case req.ExpiresAt != nil:
		if !req.ExpiresAt.After(now) || req.ExpiresAt.Sub(now) > maxTaskTTL {
			fields = append(fields, api.FieldError{Field: "expires_at", Message: "must be in the future and within 24h"})
		} else {
			expires = req.ExpiresAt.UTC()
		}
	}
	cid := req.CorrelationID
	if cid == "" {
		cid = httpapi.CorrelationID(ctx)
	} else if !httpapi.ValidCorrelationID(cid) {
		fields = append(fields, api.FieldError{Field: "correlation_id", Message: "1-128 characters of [A-Za-z0-9._:-]"})
	}
	if len(fields) > 0 {
		return store.Task{}, fields, nil
	}
	var compact json.RawMessage
	if b, err := compactJSON(req.Params); err == nil {
		compact = b
	}
	return store.Task{ID: httpapi.NewID("tsk_"), NodeID: req.NodeID, Type: req.Type, Params: compact,
		State: api.TaskQueued, CorrelationID: cid, CreatedBy: httpapi.Actor(ctx), CreatedAt: now, ExpiresAt: expires}, nil, nil
}

func compactJSON(b json.RawMessage) (json.RawMessage, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// List is GET /api/v1/tasks, newest first, filtered by node_id, type,
// state and correlation_id.
func (s *Room) List(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	tasks, err := s.store.ListTasks(r.Context(), store.TaskFilter{NodeID: q.Get("node_id"), Type: q.Get("type"),
		State: api.TaskState(q.Get("state")), CorrelationID: q.Get("correlation_id"), Limit: limit})
	if err != nil {
		return err
	}
	out := make([]api.Task, 0, len(tasks))
	for _, t := range tasks {
		out = append(out, View(t))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// Show (GET /api/v1/tasks/{id}) returns a task with its events. With
// ?wait=DURATION it waits (up to 60s) for the task to finish; this is an
// operator convenience and re-reads the task every 200ms, unlike the node
// long-poll.
func (s *Room) Show(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return httpapi.Invalid([]api.FieldError{{Field: "wait", Message: "must be a duration such as 30s"}})
		}
		wait = min(d, time.Minute)
	}
	deadline := time.Now().Add(wait)
	for {
		t, err := s.store.GetTask(ctx, id)
		if err != nil {
			return httpapi.StoreError(err, "task", id)
		}
		if t.State.Terminal() || !time.Now().Before(deadline) {
			v := View(t)
			v.Envelope = Envelope(t, s.signer.SigningKID())
			evs, err := s.store.ListTaskEvents(ctx, id)
			if err != nil {
				return err
			}
			for _, e := range evs {
				var te api.TaskEvent
				if json.Unmarshal(e.Event, &te) == nil {
					v.Events = append(v.Events, te)
				}
			}
			httpapi.WriteJSON(w, http.StatusOK, v)
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Cancel is POST /api/v1/tasks/{id}/cancel.
func (s *Room) Cancel(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	t, err := s.store.CancelTask(ctx, id, s.cfg.Now().UTC(), func(t store.Task) []store.AuditEvent {
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "task.cancel", Target: id,
			Result: "canceled", CID: t.CorrelationID})}
	})
	if err != nil {
		return httpapi.StoreError(err, "task", id)
	}
	httpapi.WriteJSON(w, http.StatusOK, View(t))
	return nil
}

// Types is GET /api/v1/task-types.
func (s *Room) Types(w http.ResponseWriter, _ *http.Request) error {
	httpapi.WriteJSON(w, http.StatusOK, s.cfg.Registry.Types())
	return nil
}
