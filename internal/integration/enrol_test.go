package integration

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// TestHealthProbeEndToEnd enrols a real agent over mTLS, sees it healthy,
// runs diag.health_probe through the operator API and checks the result,
// the phase events, timings and the audit trail with one correlation id.
func TestHealthProbeEndToEnd(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t))
			bt := e.createHost("node-a")
			e.startAgent("node-a", bt.Token, agentOpts{})
			h := e.waitHostStatus("node-a", api.HostHealthy, 10*time.Second)
			if !h.Schedulable || !h.Enrolled || h.OSFamily != "linux" {
				t.Fatalf("host = %+v, want schedulable enrolled linux", h)
			}
			if h.Capabilities == nil || h.Capabilities.RAMTotalMB < 256 {
				t.Fatalf("capabilities = %+v, want total system memory", h.Capabilities)
			}

			task := e.enqueue("node-a", "diag.health_probe", map[string]any{})
			got := e.waitTask(task.ID, 30*time.Second)
			if got.State != api.TaskSucceeded {
				t.Fatalf("task state %s, result %+v", got.State, got.Result)
			}
			var out struct {
				KernelVersion string `json:"kernel_version"`
				MemTotalMB    int    `json:"mem_total_mb"`
			}
			if err := json.Unmarshal(got.Result.Output, &out); err != nil || out.KernelVersion == "" {
				t.Fatalf("output %s: %v", got.Result.Output, err)
			}
			for _, k := range []string{"kernel_ms", "memory_ms", "kvm_ms", "root_fs_ms", "diagnostic_path_ms"} {
				if _, ok := got.Result.Timings[k]; !ok {
					t.Errorf("timings lack %q: %v", k, got.Result.Timings)
				}
			}
			phases := map[string]bool{}
			for _, ev := range got.Events {
				phases[ev.Phase] = true
			}
			for _, p := range []string{"started", "kernel", "memory", "gpu", "root_fs"} {
				if !phases[p] {
					t.Errorf("no %q event; events %+v", p, got.Events)
				}
			}
			if got.Result.CorrelationID != task.CorrelationID {
				t.Errorf("result correlation id %q, want %q", got.Result.CorrelationID, task.CorrelationID)
			}
			// The audit records are written after the task's state they
			// describe is visible: wait for them, within a bound.
			var evs []api.AuditEvent
			want := []string{"task.enqueue", "task.claim", "task.result"}
			missing := want
			for deadline := time.Now().Add(10 * time.Second); len(missing) > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				evs = nil
				e.op(http.MethodGet, "/api/v1/audit?correlation_id="+task.CorrelationID, nil, &evs)
				missing = slices.DeleteFunc(slices.Clone(want), func(a string) bool {
					return slices.ContainsFunc(evs, func(ev api.AuditEvent) bool { return ev.Action == a })
				})
			}
			if len(missing) > 0 {
				t.Errorf("audit for correlation id lacks %v: %+v", missing, evs)
			}
		})
	}
}

// TestRegisterErrors checks every documented enrolment refusal.
func TestRegisterErrors(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.RegisterBurst = 1000; c.RegisterRate = 1000 })
	csr := func() string {
		k, _ := pki.NewNodeKey()
		c, _ := pki.CSRFor(k)
		return string(c)
	}
	good := e.createHost("good")
	used := e.createHost("used")
	e.enroll("used", used.Token)
	disabled := e.createHost("disabled")
	e.op(http.MethodPost, "/api/v1/hosts/disabled/disable", nil, nil)
	revoked := e.createHost("revoked")
	e.op(http.MethodPost, "/api/v1/hosts/revoked/revoke", nil, nil)
	expired := e.createHost("expired")
	rotated := e.createHost("rotated")
	var fresh api.BootstrapToken
	e.op(http.MethodPost, "/api/v1/hosts/rotated/rotate-token", nil, &fresh)

	short := validCaps()
	short.RAMTotalMB = 128
	tests := []struct {
		name     string
		req      api.RegisterRequest
		before   func()
		status   int
		code     string
		field    string
		fieldMsg string
	}{
		{name: "unknown host", req: api.RegisterRequest{HostID: "nobody", BootstrapToken: good.Token, CSRPEM: csr(), Capabilities: validCaps()},
			status: 404, code: "unknown_host"},
		{name: "wrong token", req: api.RegisterRequest{HostID: "good", BootstrapToken: "drv_bt_wrong", CSRPEM: csr(), Capabilities: validCaps()},
			status: 401, code: "bootstrap_token_invalid"},
		{name: "another host's token", req: api.RegisterRequest{HostID: "good", BootstrapToken: disabled.Token, CSRPEM: csr(), Capabilities: validCaps()},
			status: 401, code: "bootstrap_token_invalid"},
		{name: "reused token", req: api.RegisterRequest{HostID: "used", BootstrapToken: used.Token, CSRPEM: csr(), Capabilities: validCaps()},
			status: 401, code: "bootstrap_token_invalid"},
		{name: "rotated-out token", req: api.RegisterRequest{HostID: "rotated", BootstrapToken: rotated.Token, CSRPEM: csr(), Capabilities: validCaps()},
			status: 401, code: "bootstrap_token_invalid"},
		{name: "expired token", req: api.RegisterRequest{HostID: "expired", BootstrapToken: expired.Token, CSRPEM: csr(), Capabilities: validCaps()},
			before: func() { expireToken(t, e, "expired") }, status: 401, code: "bootstrap_token_expired"},
		{name: "disabled host", req: api.RegisterRequest{HostID: "disabled", BootstrapToken: disabled.Token, CSRPEM: csr(), Capabilities: validCaps()},
			status: 403, code: "host_disabled"},
		{name: "revoked host", req: api.RegisterRequest{HostID: "revoked", BootstrapToken: revoked.Token, CSRPEM: csr(), Capabilities: validCaps()},
			status: 403, code: "host_revoked"},
		{name: "too little RAM", req: api.RegisterRequest{HostID: "good", BootstrapToken: good.Token, CSRPEM: csr(), Capabilities: short},
			status: 422, code: "invalid_payload", field: "capabilities.ram_total_mb", fieldMsg: "ram_total_mb >= 256"},
		{name: "missing csr", req: api.RegisterRequest{HostID: "good", BootstrapToken: good.Token, Capabilities: validCaps()},
			status: 422, code: "invalid_payload", field: "csr_pem"},
		{name: "rotated token works", req: api.RegisterRequest{HostID: "rotated", BootstrapToken: fresh.Token, CSRPEM: csr(), Capabilities: validCaps()},
			status: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			st, body, _ := e.register(tt.req)
			if st != tt.status {
				t.Fatalf("status %d, want %d: %s", st, tt.status, body)
			}
			if tt.code == "" {
				return
			}
			var eb api.ErrorBody
			if err := json.Unmarshal(body, &eb); err != nil {
				t.Fatalf("error body %s: %v", body, err)
			}
			if eb.Error.Code != tt.code || eb.Error.CorrelationID == "" {
				t.Fatalf("error %+v, want code %s with a correlation id", eb.Error, tt.code)
			}
			if tt.field != "" {
				found := false
				for _, f := range eb.Error.Fields {
					if f.Field == tt.field && (tt.fieldMsg == "" || f.Message == tt.fieldMsg) {
						found = true
					}
				}
				if !found {
					t.Fatalf("fields %+v lack %s %q", eb.Error.Fields, tt.field, tt.fieldMsg)
				}
			}
		})
	}
	// Anonymous failures are not evidence: statuses stay as they were.
	var h api.Host
	e.op(http.MethodGet, "/api/v1/hosts/good", nil, &h)
	if h.Status != api.HostHealthy && h.Status != api.HostUnknown {
		t.Fatalf("good host status %s", h.Status)
	}
	e.op(http.MethodGet, "/api/v1/hosts/used", nil, &h)
	if h.Status == api.HostAuthFailed {
		t.Errorf("host 'used' status %s after a reused token: anonymous failures must not change it", h.Status)
	}
	if !e.auditHas("host.register", "used", "bootstrap_token_invalid") {
		t.Error("refused registration not audited")
	}
}

// expireToken moves a host's token expiry into the past.
func expireToken(t *testing.T, e *env, id string) {
	t.Helper()
	_, err := e.st.UpdateHost(t.Context(), id, func(h *storeHost) error {
		h.TokenExpiresAt = time.Now().Add(-time.Minute)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRegisterRateLimited checks 429 with Retry-After.
func TestRegisterRateLimited(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.RegisterRate = 0.1; c.RegisterBurst = 2 })
	req := api.RegisterRequest{HostID: "x", BootstrapToken: "t", CSRPEM: "-", Capabilities: validCaps()}
	var last int
	var hdr http.Header
	for i := 0; i < 5; i++ {
		last, _, hdr = e.register(req)
	}
	if last != http.StatusTooManyRequests {
		t.Fatalf("status %d after a burst, want 429", last)
	}
	if hdr.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
}
