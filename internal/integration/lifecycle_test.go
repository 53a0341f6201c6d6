package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestAgentRenewsAndFollowsKeyRotation: with a short certificate lifetime
// the agent renews on its own (new not_after, still healthy), and after a
// signing-key rotation it fetches the new JWKS and keeps running tasks.
func TestAgentRenewsAndFollowsKeyRotation(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.CertTTL = 4 * time.Second })
	bt := e.createHost("node-n")
	e.startAgent("node-n", bt.Token, agentOpts{})
	first := e.waitHostStatus("node-n", api.HostHealthy, 10*time.Second)
	if first.CertNotAfter == nil {
		t.Fatal("no certificate recorded")
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		var h api.Host
		e.op(http.MethodGet, "/api/v1/hosts/node-n", nil, &h)
		if h.CertNotAfter != nil && h.CertNotAfter.After(*first.CertNotAfter) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent did not renew its certificate")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !e.auditHas("host.renew", "node-n", "ok") {
		t.Error("renewal not audited")
	}

	var rot struct {
		ActiveKID string   `json:"active_kid"`
		JWKS      api.JWKS `json:"jwks"`
	}
	if st := e.op(http.MethodPost, "/api/v1/signing-keys/rotate", nil, &rot); st != http.StatusOK || len(rot.JWKS.Keys) < 2 {
		t.Fatalf("rotate: %d %+v", st, rot)
	}
	task := e.enqueue("node-n", "diag.health_probe", nil)
	if got := e.waitTask(task.ID, 30*time.Second); got.State != api.TaskSucceeded {
		t.Fatalf("task after rotation: %s %+v", got.State, got.Result)
	}
	// Still healthy after more renewals (the certificate lives 4s).
	time.Sleep(3 * time.Second)
	e.waitHostStatus("node-n", api.HostHealthy, 5*time.Second)
	// Renewal happens at about two thirds of the lifetime, not in a loop.
	var evs []api.AuditEvent
	e.op(http.MethodGet, "/api/v1/audit?limit=1000&target=node-n", nil, &evs)
	renewals := 0
	for _, ev := range evs {
		if ev.Action == "host.renew" {
			renewals++
		}
	}
	if renewals > 8 {
		t.Fatalf("%d renewals of a 4s certificate in about 8s: renewing in a loop", renewals)
	}
}

// TestLocalAndHealthEndpoints: the agent's local API and the control
// plane's health, readiness and metrics routes.
func TestLocalAndHealthEndpoints(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("node-h")
	a, _ := e.startAgent("node-h", bt.Token, agentOpts{})
	e.waitHostStatus("node-h", api.HostHealthy, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr, err := a.LocalAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The agent's /healthz turns ok once a heartbeat got through.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, body := get("http://" + addr.String() + "/healthz")
		if st == http.StatusOK && strings.Contains(body, `"status":"ok"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent healthz: %d %s", st, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, body := get("http://" + addr.String() + "/v1/capacity")
	var capa api.CapacityReport
	if st != http.StatusOK || json.Unmarshal([]byte(body), &capa) != nil || capa.Total.VCPUs < 1 || capa.Total.MemoryMiB < 256 ||
		capa.Free.MemoryMiB > capa.Total.MemoryMiB {
		t.Fatalf("capacity: %d %s", st, body)
	}
	if st, body := get("http://" + addr.String() + "/metrics"); st != http.StatusOK || !strings.Contains(body, "drover_agent_heartbeats_total") {
		t.Fatalf("agent metrics: %d", st)
	}
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "drover_heartbeats_total"} {
		if st, body := get(e.opURL + path); st != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("control plane %s: %d %.200s", path, st, body)
		}
	}
	// The operator API refuses requests without a valid token.
	req, _ := http.NewRequest(http.MethodGet, e.opURL+"/api/v1/hosts", nil)
	req.Header.Set("Authorization", "Bearer drv_op_nope")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad operator token: %d, want 401", resp.StatusCode)
	}
}
