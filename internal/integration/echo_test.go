package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestEchoEndToEnd queues diag.echo through the operator API for a real
// agent and sees its message come back with the node id and the time it
// ran: the whole task path (enqueue, claim, signed envelope, handler,
// result) with the smallest task there is.
func TestEchoEndToEnd(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	e.startAgent("node-echo", e.createHost("node-echo").Token, agentOpts{})
	e.waitHostStatus("node-echo", api.HostHealthy, 10*time.Second)

	before := time.Now().UTC().Add(-time.Second)
	const msg = "hello from preflight ✓"
	tk := e.enqueue("node-echo", task.TypeEcho, task.EchoParams{Message: msg})
	got := e.waitTask(tk.ID, 30*time.Second)
	if got.State != api.TaskSucceeded || got.Result == nil {
		t.Fatalf("task state %s, result %+v", got.State, got.Result)
	}
	var out task.EchoOutput
	if err := json.Unmarshal(got.Result.Output, &out); err != nil {
		t.Fatalf("output %s: %v", got.Result.Output, err)
	}
	if out.Message != msg || out.NodeID != "node-echo" {
		t.Fatalf("output = %+v, want message %q from node-echo", out, msg)
	}
	if out.RanAt.Before(before) || out.RanAt.After(time.Now().Add(time.Second)) || out.RanAt.Location() != time.UTC {
		t.Fatalf("ran_at = %s, want a UTC time within this test", out.RanAt)
	}
	if got.Result.CorrelationID != tk.CorrelationID {
		t.Errorf("result correlation id %q, want %q", got.Result.CorrelationID, tk.CorrelationID)
	}

	// The operator API refuses a message over 1 KiB before anything is queued.
	var eb api.ErrorBody
	big, _ := json.Marshal(task.EchoParams{Message: strings.Repeat("x", task.MaxEchoMessage+1)})
	if st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: "node-echo", Type: task.TypeEcho,
		Params: big}, &eb); st != http.StatusUnprocessableEntity || len(eb.Error.Fields) != 1 ||
		eb.Error.Fields[0].Field != "params.message" {
		t.Fatalf("oversized message: HTTP %d %+v, want 422 on params.message", st, eb)
	}
}
