package integration

import (
	"net/http"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// TestNodeRoutesBoundToIdentity: node A's certificate can never act on
// node B's routes, and no route but register works without a certificate.
func TestNodeRoutesBoundToIdentity(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t))
			a := e.enroll("node-a", e.createHost("node-a").Token)
			e.enroll("node-b", e.createHost("node-b").Token)
			task := e.enqueue("node-b", "diag.health_probe", nil)

			routes := []struct {
				method, path string
				body         any
			}{
				{http.MethodPost, nodePath("node-b", "/heartbeat"), api.Heartbeat{}},
				{http.MethodGet, nodePath("node-b", "/tasks/wait?timeout=1s"), nil},
				{http.MethodPost, nodePath("node-b", "/tasks/"+task.ID+"/events"), api.TaskEvent{Phase: "x"}},
				{http.MethodPost, nodePath("node-b", "/tasks/"+task.ID+"/result"), api.TaskResult{Status: api.ResultSucceeded}},
				{http.MethodPost, nodePath("node-b", "/renew"), api.RenewRequest{}},
				{http.MethodGet, nodePath("node-b", "/jwks"), nil},
			}
			for _, r := range routes {
				if st, code, body := e.nodeCall(a.client, r.method, r.path, r.body); st != http.StatusForbidden || code != "node_mismatch" {
					t.Errorf("A on %s %s: %d %s %s, want 403 node_mismatch", r.method, r.path, st, code, body)
				}
				if st, code, _ := e.nodeCall(e.rawClient(nil), r.method, r.path, r.body); st != http.StatusUnauthorized || code != "client_certificate_required" {
					t.Errorf("no cert on %s %s: %d %s, want 401 client_certificate_required", r.method, r.path, st, code)
				}
			}
			// A posting a result for B's task through A's own path is a 404:
			// the task does not belong to A.
			st, _, _ := e.nodeCall(a.client, http.MethodPost, nodePath("node-a", "/tasks/"+task.ID+"/result"),
				api.TaskResult{Status: api.ResultSucceeded})
			if st != http.StatusNotFound {
				t.Errorf("A posting B's task via its own path: %d, want 404", st)
			}
			var got api.Task
			e.op(http.MethodGet, "/api/v1/tasks/"+task.ID, nil, &got)
			if got.State != api.TaskQueued {
				t.Errorf("B's task state %s after A's attempts, want queued", got.State)
			}
		})
	}
}

// TestRevokedHost: a revoked host cannot renew, and its open connection is
// refused with "node identity revoked" at the next request.
func TestRevokedHost(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := e.enroll("node-r", e.createHost("node-r").Token)
	if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-r", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("heartbeat before revoke: %d %s", st, body)
	}
	// Renewal works before revocation.
	k, _ := pki.NewNodeKey()
	csr, _ := pki.CSRFor(k)
	if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-r", "/renew"), api.RenewRequest{CSRPEM: string(csr)}); st != http.StatusOK {
		t.Fatalf("renew: %d %s", st, body)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-r/revoke", nil, nil); st != http.StatusOK {
		t.Fatalf("revoke: %d", st)
	}
	// Same client, same pooled connection.
	st, code, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-r", "/heartbeat"), api.Heartbeat{})
	if st != http.StatusForbidden || code != "node_identity_revoked" || !contains(string(body), "node identity revoked") {
		t.Fatalf("heartbeat after revoke: %d %s %s", st, code, body)
	}
	if st, code, _ := e.nodeCall(n.client, http.MethodPost, nodePath("node-r", "/renew"), api.RenewRequest{CSRPEM: string(csr)}); st != http.StatusForbidden || code != "node_identity_revoked" {
		t.Fatalf("renew after revoke: %d %s", st, code)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-r/rotate-token", nil, nil); st != http.StatusConflict {
		t.Fatalf("rotate-token of a revoked host: %d, want 409", st)
	}
	if !e.auditHas("host.revoke", "node-r", "ok") || !e.auditHas("node.auth", "node-r", "node_identity_revoked") {
		t.Error("revocation or refused renewal not audited")
	}
}

// TestReenrolmentSupersedesOldCertificates: after a token rotation and a
// new enrolment, certificates of the earlier identity (a clone) are refused.
func TestReenrolmentSupersedesOldCertificates(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	old := e.enroll("node-c", e.createHost("node-c").Token)
	var bt api.BootstrapToken
	e.op(http.MethodPost, "/api/v1/hosts/node-c/rotate-token", nil, &bt)
	time.Sleep(1100 * time.Millisecond) // certificates carry second precision
	fresh := e.enroll("node-c", bt.Token)
	if st, code, _ := e.nodeCall(old.client, http.MethodPost, nodePath("node-c", "/heartbeat"), api.Heartbeat{}); st != http.StatusForbidden || code != "node_identity_superseded" {
		t.Fatalf("old identity: %d %s, want 403 node_identity_superseded", st, code)
	}
	if st, _, body := e.nodeCall(fresh.client, http.MethodPost, nodePath("node-c", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("new identity: %d %s", st, body)
	}
}

// TestHeartbeatStaleAndBack: a host goes stale after three missed
// intervals and healthy again on its next heartbeat; both are audited.
func TestHeartbeatStaleAndBack(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t), fastLiveness)
			n := e.enroll("node-s", e.createHost("node-s").Token)
			beat := func() {
				if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-s", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
					t.Fatalf("heartbeat: %d %s", st, body)
				}
			}
			beat()
			e.waitHostStatus("node-s", api.HostHealthy, 2*time.Second)
			h := e.waitHostStatus("node-s", api.HostStale, 3*time.Second) // fastLiveness: interval 200ms
			if h.Schedulable {
				t.Error("stale host is schedulable")
			}
			beat()
			e.waitHostStatus("node-s", api.HostHealthy, 2*time.Second)
			if !e.auditHas("host.status", "node-s", "stale") || !e.auditHas("host.status", "node-s", "healthy") {
				t.Error("status transitions not audited")
			}
		})
	}
}

// TestAgentReportedStatus: an agent whose results cannot be posted says so
// in its heartbeat and the host shows task_result_failed until it recovers.
func TestAgentReportedStatus(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := e.enroll("node-d", e.createHost("node-d").Token)
	beat := func(diag string) {
		if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-d", "/heartbeat"), api.Heartbeat{Diagnostic: diag}); st != http.StatusOK {
			t.Fatalf("heartbeat: %d %s", st, body)
		}
	}
	beat("task_result_post_failed")
	h := e.waitHostStatus("node-d", api.HostTaskResultFailed, 2*time.Second)
	if h.Schedulable || h.StatusReason != string(signal.TaskResultPostFailed) {
		t.Fatalf("host %+v", h)
	}
	beat("")
	e.waitHostStatus("node-d", api.HostHealthy, 2*time.Second)
}
