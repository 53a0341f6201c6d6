package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestTaskBatch: POST /api/v1/tasks:batch queues every item in one
// transaction (on both stores) and the agents run them; a batch with bad
// items answers 422 with each item's field errors and queues nothing.
func TestTaskBatch(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t))
			for _, n := range []string{"node-b1", "node-b2"} {
				e.startAgent(n, e.createHost(n).Token, agentOpts{})
				e.waitHostStatus(n, api.HostHealthy, 10*time.Second)
			}
			var req api.EnqueueTaskBatchRequest
			for i := range 40 {
				params, _ := json.Marshal(task.EchoParams{Message: fmt.Sprint("batch ", i)})
				req.Items = append(req.Items, api.EnqueueTaskRequest{NodeID: []string{"node-b1", "node-b2"}[i%2],
					Type: task.TypeEcho, Params: params})
			}
			var resp api.EnqueueTaskBatchResponse
			if st := e.op(http.MethodPost, "/api/v1/tasks:batch", req, &resp); st != http.StatusCreated {
				t.Fatalf("batch: HTTP %d", st)
			}
			if len(resp.Tasks) != 40 {
				t.Fatalf("batch answered %d tasks, want 40", len(resp.Tasks))
			}
			for i, tk := range resp.Tasks {
				got := e.waitTask(tk.ID, 30*time.Second)
				var o task.EchoOutput
				if got.State != api.TaskSucceeded || json.Unmarshal(got.Result.Output, &o) != nil ||
					o.Message != fmt.Sprint("batch ", i) || o.NodeID != req.Items[i].NodeID {
					t.Fatalf("task %d: %s %+v", i, got.State, got.Result)
				}
			}
			var evs []api.AuditEvent
			e.op(http.MethodGet, "/api/v1/audit?action=task.enqueue_batch", nil, &evs)
			if len(evs) != 1 || evs[0].Target != resp.Tasks[0].ID {
				t.Fatalf("batch audit records %+v, want one naming %s", evs, resp.Tasks[0].ID)
			}

			// All or nothing: two bad items, nothing queued.
			bad := api.EnqueueTaskBatchRequest{Items: []api.EnqueueTaskRequest{
				{NodeID: "node-b1", Type: task.TypeEcho, Params: json.RawMessage(`{"message":"ok"}`)},
				{NodeID: "nope", Type: task.TypeEcho},
				{NodeID: "node-b2", Type: task.TypeEcho, Params: json.RawMessage(`{"message":"ok"}`), TTL: api.Duration(time.Millisecond)},
			}}
			var ce api.ErrorBody
			if st := e.op(http.MethodPost, "/api/v1/tasks:batch", bad, &ce); st != http.StatusUnprocessableEntity {
				t.Fatalf("bad batch: HTTP %d", st)
			}
			var names []string
			for _, f := range ce.Error.Fields {
				names = append(names, f.Field)
			}
			if !slices.Equal(names, []string{"items[1].node_id", "items[2].ttl"}) {
				t.Fatalf("bad batch field errors %+v", ce.Error.Fields)
			}
			var all []api.Task
			e.op(http.MethodGet, "/api/v1/tasks?limit=1000", nil, &all)
			if len(all) != 40 {
				t.Fatalf("%d tasks after a refused batch, want 40", len(all))
			}
			if st := e.op(http.MethodPost, "/api/v1/tasks:batch", api.EnqueueTaskBatchRequest{}, &ce); st != http.StatusUnprocessableEntity {
				t.Fatalf("empty batch: HTTP %d", st)
			}
		})
	}
}
