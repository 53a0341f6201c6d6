package integration

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestClaimTaskExpiringWithinTheSecond: a task claimed in the same second
// it expires in is delivered, with its envelope's expiry rounded up to the
// next whole second. The envelope's iat and exp are whole seconds and exp
// must be after iat; the claim used to fail with a 500 (seen as a flaky
// terminal deadline test, whose terminal.open expires with the dispatch
// deadline).
func TestClaimTaskExpiringWithinTheSecond(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := e.enroll("node-x", e.createHost("node-x").Token)
	// Begin early in a second, so that the enqueue and the claim fall in
	// the second the task expires in.
	if now := time.Now(); now.Nanosecond() > 200e6 {
		time.Sleep(time.Until(now.Truncate(time.Second).Add(time.Second)))
	}
	exp := time.Now().Truncate(time.Second).Add(900 * time.Millisecond).UTC()
	var task api.Task
	req := api.EnqueueTaskRequest{NodeID: "node-x", Type: "diag.health_probe", ExpiresAt: &exp}
	if st := e.op(http.MethodPost, "/api/v1/tasks", req, &task); st != http.StatusCreated {
		t.Fatalf("enqueue: HTTP %d", st)
	}
	st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-x", "/tasks/wait?timeout=1s"), nil)
	if st != http.StatusOK {
		t.Fatalf("claim: HTTP %d %s", st, body)
	}
	var d api.TaskDelivery
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	if want := exp.Truncate(time.Second).Add(time.Second); d.TaskID != task.ID || !d.ExpiresAt.Equal(want) || d.Envelope == "" {
		t.Fatalf("delivery %s expires %s (want %s), envelope %d bytes", d.TaskID, d.ExpiresAt, want, len(d.Envelope))
	}
}
