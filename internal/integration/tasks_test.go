package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestEnqueueValidation: only registered task types with valid params are
// accepted, with field-level errors.
func TestEnqueueValidation(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	e.createHost("node-v")
	tests := []struct {
		name  string
		req   string
		field string
	}{
		{"unknown type", `{"node_id":"node-v","type":"exec.shell","params":{"cmd":"id"}}`, "type"},
		{"unknown param", `{"node_id":"node-v","type":"diag.health_probe","params":{"bogus":1}}`, "params"},
		{"relative path", `{"node_id":"node-v","type":"diag.health_probe","params":{"diagnostic_path":"tmp"}}`, "params.diagnostic_path"},
		{"params not an object", `{"node_id":"node-v","type":"diag.health_probe","params":[1]}`, "params"},
		{"unknown node", `{"node_id":"ghost","type":"diag.health_probe"}`, "node_id"},
		{"missing node", `{"type":"diag.health_probe"}`, "node_id"},
		{"ttl too long", `{"node_id":"node-v","type":"diag.health_probe","ttl":"48h"}`, "ttl"},
		{"expires in the past", `{"node_id":"node-v","type":"diag.health_probe","expires_at":"2001-01-01T00:00:00Z"}`, "expires_at"},
		{"both ttl and expires_at", `{"node_id":"node-v","type":"diag.health_probe","ttl":"1m","expires_at":"2099-01-01T00:00:00Z"}`, "ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var eb api.ErrorBody
			st := e.op(http.MethodPost, "/api/v1/tasks", json.RawMessage(tt.req), &eb)
			if st != http.StatusUnprocessableEntity {
				t.Fatalf("status %d, want 422: %+v", st, eb)
			}
			found := false
			for _, f := range eb.Error.Fields {
				if strings.HasPrefix(f.Field, tt.field) {
					found = true
				}
			}
			if !found {
				t.Fatalf("fields %+v lack %q", eb.Error.Fields, tt.field)
			}
		})
	}
}

// TestTaskQueueSemantics drives the node API by hand: long-poll wake-up,
// claim, idempotent result, conflicting result, redelivery after the lease,
// expiry and cancel.
func TestTaskQueueSemantics(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t))
			n := e.enroll("node-q", e.createHost("node-q").Token)
			wait := func(timeout string) (int, api.TaskDelivery) {
				st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-q", "/tasks/wait?timeout="+timeout), nil)
				var d api.TaskDelivery
				if st == http.StatusOK {
					_ = json.Unmarshal(body, &d)
				}
				return st, d
			}
			// Empty queue: 204 after the timeout.
			if st, _ := wait("300ms"); st != http.StatusNoContent {
				t.Fatalf("empty wait: %d, want 204", st)
			}
			// A waiting poll is woken by an enqueue, well before its timeout.
			type res struct {
				st int
				d  api.TaskDelivery
				at time.Time
			}
			ch := make(chan res, 1)
			go func() { st, d := wait("5s"); ch <- res{st, d, time.Now()} }()
			time.Sleep(200 * time.Millisecond)
			enq := time.Now()
			task := e.enqueue("node-q", "diag.health_probe", nil)
			r := <-ch
			if r.st != http.StatusOK || r.d.TaskID != task.ID {
				t.Fatalf("woken wait: %d %+v", r.st, r.d)
			}
			if lat := r.at.Sub(enq); lat > 2*time.Second {
				t.Fatalf("wake-up took %s", lat)
			}
			if r.d.Envelope == "" || r.d.CorrelationID != task.CorrelationID || r.d.Attempt != 1 {
				t.Fatalf("delivery %+v", r.d)
			}
			// Claimed once: nothing more to deliver.
			if st, _ := wait("200ms"); st != http.StatusNoContent {
				t.Fatalf("second wait: %d, want 204", st)
			}
			result := api.TaskResult{Status: api.ResultSucceeded, Output: json.RawMessage(`{"ok":true}`),
				CorrelationID: task.CorrelationID, FinishedAt: time.Now().UTC().Truncate(time.Millisecond)}
			path := nodePath("node-q", "/tasks/"+task.ID+"/result")
			for i := 0; i < 2; i++ { // the same result twice is fine
				if st, _, body := e.nodeCall(n.client, http.MethodPost, path, result); st != http.StatusOK {
					t.Fatalf("post result #%d: %d %s", i+1, st, body)
				}
			}
			other := result
			other.Status, other.Error = api.ResultFailed, &api.ResultError{Code: "x", Message: "y"}
			if st, _, _ := e.nodeCall(n.client, http.MethodPost, path, other); st != http.StatusConflict {
				t.Fatalf("conflicting result: %d, want 409", st)
			}
			if got := e.waitTask(task.ID, time.Second); got.State != api.TaskSucceeded {
				t.Fatalf("state %s", got.State)
			}

			// Cancel a queued task: it is never delivered.
			c := e.enqueue("node-q", "diag.health_probe", nil)
			if st := e.op(http.MethodPost, "/api/v1/tasks/"+c.ID+"/cancel", nil, nil); st != http.StatusOK {
				t.Fatalf("cancel: %d", st)
			}
			if st := e.op(http.MethodPost, "/api/v1/tasks/"+c.ID+"/cancel", nil, nil); st != http.StatusConflict {
				t.Fatalf("cancel twice: %d, want 409", st)
			}
			if st, _ := wait("200ms"); st != http.StatusNoContent {
				t.Fatalf("canceled task delivered")
			}

			// A task whose TTL passes while queued expires.
			var x api.Task
			e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: "node-q", Type: "diag.health_probe",
				TTL: api.Duration(time.Second)}, &x)
			if got := e.waitTask(x.ID, 5*time.Second); got.State != api.TaskExpired {
				t.Fatalf("state %s, want expired", got.State)
			}
		})
	}
}

// TestLeaseRedelivery: a dispatched task without a result is delivered
// again after its lease, with a higher attempt count.
func TestLeaseRedelivery(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := e.enroll("node-l", e.createHost("node-l").Token)
	task := e.enqueue("node-l", "diag.health_probe", nil)
	st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-l", "/tasks/wait?timeout=1s"), nil)
	if st != http.StatusOK {
		t.Fatalf("claim: %d %s", st, body)
	}
	// Shorten the lease in the store as if time had passed.
	if _, err := e.st.StartTask(t.Context(), "node-l", task.ID, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		st, _, body = e.nodeCall(n.client, http.MethodGet, nodePath("node-l", "/tasks/wait?timeout=2s"), nil)
		if st == http.StatusOK {
			var d api.TaskDelivery
			_ = json.Unmarshal(body, &d)
			if d.TaskID != task.ID || d.Attempt != 2 {
				t.Fatalf("redelivery %+v, want %s attempt 2", d, task.ID)
			}
			if !e.auditHas("task.requeue", task.ID, "lease_expired") {
				t.Error("requeue not audited")
			}
			return
		}
	}
	t.Fatal("task was not redelivered after its lease")
}
