package tasks

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// maxBatchBody bounds a batch's request body (MaxTaskBatch requests of a
// few KB each).
const maxBatchBody = 16 << 20

// CreateBatch (POST /api/v1/tasks:batch) validates up to api.MaxTaskBatch
// enqueue requests and queues them in one store transaction: all of them,
// or none with every item's field errors (items[i].field). Each node's
// long-polls are woken once. The batch is audited once (task.enqueue_batch:
// count, nodes, types, first and last task id; the tasks carry the
// request's correlation id unless an item names its own): one audit row per
// task would be one more store write per task and cost what the batch
// saves.
func (s *Room) CreateBatch(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var req api.EnqueueTaskBatchRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBatchBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return &httpapi.Error{Status: http.StatusUnprocessableEntity,
			CodedError: api.CodedError{Code: "invalid_json", Message: "request body: " + err.Error()}}
	}
	switch n := len(req.Items); {
	case n == 0:
		return httpapi.Invalid([]api.FieldError{{Field: "items", Message: "required: at least one task"}})
	case n > api.MaxTaskBatch:
		return httpapi.Invalid([]api.FieldError{{Field: "items",
			Message: fmt.Sprintf("%d tasks; at most %d in one batch", n, api.MaxTaskBatch)}})
	}
	now := s.cfg.Now().UTC()
	hosts := map[string]bool{}
	ts := make([]store.Task, 0, len(req.Items))
	var fields []api.FieldError
	for i, item := range req.Items {
		t, fe, err := s.prepare(ctx, item, now, hosts)
		if err != nil {
			return fmt.Errorf("enqueue batch item %d: %w", i, err)
		}
		for _, f := range fe {
			f.Field = "items[" + strconv.Itoa(i) + "]." + f.Field
			fields = append(fields, f)
		}
		ts = append(ts, t)
	}
	if len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	var nodes, types []string
	for _, t := range ts {
		if !slices.Contains(nodes, t.NodeID) {
			nodes = append(nodes, t.NodeID)
		}
		if !slices.Contains(types, t.Type) {
			types = append(types, t.Type)
		}
	}
	rec := s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "task.enqueue_batch", Target: ts[0].ID, Result: "queued",
		CID: httpapi.CorrelationID(ctx), Detail: fmt.Sprintf("count=%d nodes=%s types=%s first=%s last=%s", len(ts),
			listOrCount(nodes), listOrCount(types), ts[0].ID, ts[len(ts)-1].ID)})
	if err := s.store.InsertTasks(ctx, ts, rec); err != nil {
		return fmt.Errorf("enqueue batch of %d tasks (correlation id %s): %w", len(ts), httpapi.CorrelationID(ctx), err)
	}
	for _, n := range nodes {
		s.waiters.Wake(n) // same replica: do not wait for the event round trip
	}
	s.metrics.Enqueued.Add(float64(len(ts)))
	out := api.EnqueueTaskBatchResponse{Tasks: make([]api.Task, 0, len(ts))}
	for _, t := range ts {
		out.Tasks = append(out.Tasks, View(t))
	}
	httpapi.WriteJSON(w, http.StatusCreated, out)
	return nil
}

// listOrCount is a short list joined with commas, or its length when long.
func listOrCount(xs []string) string {
	if len(xs) > 5 {
		return strconv.Itoa(len(xs))
	}
	return strings.Join(xs, ",")
}
