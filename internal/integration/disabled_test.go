package integration

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestDisabledHostGetsNoTasks: a disabled host keeps its identity and
// liveness (heartbeat, renew, JWKS, capabilities, instances, results of
// tasks it already holds) but is dispatched nothing; its queued tasks are
// delivered once it is enabled, to a long-poll already waiting.
func TestDisabledHostGetsNoTasks(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t), fastLiveness)
			n := e.enroll("node-d", e.createHost("node-d").Token)
			held := e.enqueue("node-d", "diag.health_probe", nil)
			st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-d", "/tasks/wait?timeout=2s"), nil)
			if st != http.StatusOK {
				t.Fatalf("claim before disable: %d %s", st, body)
			}
			if st := e.op(http.MethodPost, "/api/v1/hosts/node-d/disable", nil, nil); st != http.StatusOK {
				t.Fatalf("disable: %d", st)
			}
			queued := e.enqueue("node-d", "diag.health_probe", nil)

			k := newCSR(t)
			for _, r := range []struct {
				method, path string
				body         any
				want         int
			}{
				{http.MethodPost, "/heartbeat", api.Heartbeat{}, http.StatusOK},
				{http.MethodPost, "/renew", api.RenewRequest{CSRPEM: k}, http.StatusOK},
				{http.MethodGet, "/jwks", nil, http.StatusOK},
				{http.MethodPut, "/capabilities", validCaps(), http.StatusNoContent},
				{http.MethodGet, "/instances", nil, http.StatusOK},
				{http.MethodGet, "/tasks/wait?timeout=1s", nil, http.StatusNoContent},
				{http.MethodPost, "/tasks/" + held.ID + "/events", api.TaskEvent{Phase: "started"}, http.StatusNoContent},
				{http.MethodPost, "/tasks/" + held.ID + "/result", api.TaskResult{Status: api.ResultSucceeded,
					CorrelationID: held.CorrelationID}, http.StatusOK},
			} {
				if st, code, body := e.nodeCall(n.client, r.method, nodePath("node-d", r.path), r.body); st != r.want {
					t.Errorf("disabled host %s %s: %d %s %s, want %d", r.method, r.path, st, code, body, r.want)
				}
			}
			// The operator sees it alive: a heartbeat of the disabled host
			// brings it back from stale at once.
			e.waitHostStatus("node-d", api.HostStale, 3*time.Second)
			if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-d", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
				t.Fatalf("heartbeat: %d %s", st, body)
			}
			h := e.waitHostStatus("node-d", api.HostHealthy, 300*time.Millisecond)
			if h.Enabled || h.Schedulable {
				t.Fatalf("disabled host view %+v", h)
			}
			var got api.Task
			e.op(http.MethodGet, "/api/v1/tasks/"+queued.ID, nil, &got)
			if got.State != api.TaskQueued {
				t.Fatalf("task for a disabled host is %s, want queued", got.State)
			}

			// A long-poll waiting while disabled gets the task on enable.
			type res struct {
				st   int
				body []byte
			}
			done := make(chan res, 1)
			go func() {
				st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-d", "/tasks/wait?timeout=5s"), nil)
				done <- res{st, body}
			}()
			time.Sleep(300 * time.Millisecond)
			if st := e.op(http.MethodPost, "/api/v1/hosts/node-d/enable", nil, nil); st != http.StatusOK {
				t.Fatalf("enable: %d", st)
			}
			r := <-done
			var d api.TaskDelivery
			if r.st != http.StatusOK || json.Unmarshal(r.body, &d) != nil || d.TaskID != queued.ID {
				t.Fatalf("long-poll across enable: %d %s, want the queued task %s", r.st, r.body, queued.ID)
			}
		})
	}
}

// TestRevokedHostRefusedEverywhere: every node route refuses a revoked
// host's certificate with 403 node_identity_revoked.
func TestRevokedHostRefusedEverywhere(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := e.enroll("node-r", e.createHost("node-r").Token)
	task := e.enqueue("node-r", "diag.health_probe", nil)
	if st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-r", "/tasks/wait?timeout=2s"), nil); st != http.StatusOK {
		t.Fatalf("claim: %d %s", st, body)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-r/revoke", nil, nil); st != http.StatusOK {
		t.Fatalf("revoke: %d", st)
	}
	csr := newCSR(t)
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{http.MethodPost, "/heartbeat", api.Heartbeat{}},
		{http.MethodPost, "/renew", api.RenewRequest{CSRPEM: csr}},
		{http.MethodGet, "/jwks", nil},
		{http.MethodPut, "/capabilities", validCaps()},
		{http.MethodGet, "/tasks/wait?timeout=1s", nil},
		{http.MethodPost, "/tasks/" + task.ID + "/events", api.TaskEvent{Phase: "started"}},
		{http.MethodPost, "/tasks/" + task.ID + "/result", api.TaskResult{Status: api.ResultSucceeded}},
		{http.MethodGet, "/instances", nil},
		{http.MethodPost, "/instances/i-000000000000/status", map[string]any{"generation": 1, "phase": "Ready"}},
		{http.MethodGet, "/terminal/ts_x", nil},
	} {
		if st, code, body := e.nodeCall(n.client, r.method, nodePath("node-r", r.path), r.body); st != http.StatusForbidden || code != "node_identity_revoked" {
			t.Errorf("revoked host %s %s: %d %s %s, want 403 node_identity_revoked", r.method, r.path, st, code, body)
		}
	}
	if st, body, _ := e.register(regReq(t, "node-r", "drv_bt_guess")); st != http.StatusUnauthorized {
		t.Errorf("register of a revoked host without its token: %d %s, want the generic 401", st, body)
	}
}
