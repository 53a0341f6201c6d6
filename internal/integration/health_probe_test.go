package integration

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cli/preflight"
	"github.com/drover-dev/drover/internal/cp/healthsched"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// switchableProbe is a diag.health_probe handler whose verdict the test
// sets; it counts its runs.
func switchableProbe(healthy *atomic.Bool, runs *atomic.Int64) agent.Handlers {
	return agent.Handlers{task.TypeHealthProbe: {Timeout: 10 * time.Second, Run: func(context.Context, agent.Task) (agent.Outcome, error) {
		runs.Add(1)
		kvm := map[string]any{"name": "kvm", "ok": true}
		if !healthy.Load() {
			kvm = map[string]any{"name": "kvm", "ok": false, "reason": "kvm_missing", "detail": "no /dev/kvm"}
		}
		return agent.Outcome{Output: map[string]any{"healthy": healthy.Load(),
			"checks": []any{map[string]any{"name": "kernel", "ok": true}, kvm}}}, nil
	}}}
}

// waitHealth polls the host until its health is want and was set by a
// task other than notTask.
func (e *env) waitHealth(id string, want api.HostHealth, notTask string, within time.Duration) api.Host {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		h := e.host(id)
		if h.Health == want && h.HealthTaskID != notTask {
			return h
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("host %s health %q (task %s), want %q", id, h.Health, h.HealthTaskID, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dashboardGet logs into the dashboard with the env's operator token and
// returns the body of path.
func (e *env) dashboardGet(path string) string {
	e.t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	get := func(u string) string {
		resp, err := c.Get(e.opURL + u)
		if err != nil {
			e.t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(get("/ui/login"))
	if m == nil {
		e.t.Fatal("login page has no CSRF field")
	}
	resp, err := c.PostForm(e.opURL+"/ui/login", url.Values{"token": {e.opToken}, "csrf": {m[1]}})
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	return get(path)
}

// TestScheduledHealthProbe: with a short interval the control plane
// probes a heartbeating host on its own (created by system:health-probe),
// the result sets the host's health; when the probe turns unhealthy the
// change is audited (host.health, the probe's correlation id), becomes the
// host's last failure, shows in the fleet row and the host page, and
// preflight fails node_recovery_status naming node_health_probe_unhealthy;
// healthy again is audited too.
func TestScheduledHealthProbe(t *testing.T) {
	e := startEnv(t, openSQLite(t), fastLiveness, func(c *server.Config) { c.HealthProbeInterval = time.Second })
	const id = "hp-1"
	var healthy atomic.Bool
	var runs atomic.Int64
	healthy.Store(true)
	_, stop := e.startAgent(id, e.createHost(id).Token, agentOpts{handlers: switchableProbe(&healthy, &runs)})
	defer stop()
	e.waitHostStatus(id, api.HostHealthy, 10*time.Second)

	h := e.waitHealth(id, api.HealthHealthy, "", 15*time.Second)
	var tk api.Task
	if st := e.op(http.MethodGet, "/api/v1/tasks/"+h.HealthTaskID, nil, &tk); st != http.StatusOK {
		t.Fatalf("show task %s: HTTP %d", h.HealthTaskID, st)
	}
	if tk.CreatedBy != healthsched.Actor || tk.Type != task.TypeHealthProbe || tk.CorrelationID == "" {
		t.Fatalf("scheduled probe %+v", tk)
	}
	if h.HealthSummary != "2/2 checks ok" || h.HealthCheckedAt == nil {
		t.Fatalf("healthy host %+v", h)
	}

	healthy.Store(false)
	h = e.waitHealth(id, api.HealthUnhealthy, h.HealthTaskID, 15*time.Second)
	if h.LastFailureSignal != string(signal.HealthProbeUnhealthy) || !strings.Contains(h.HealthSummary, "kvm: kvm_missing") ||
		h.LastFailureDetail != h.HealthSummary {
		t.Fatalf("unhealthy host %+v", h)
	}
	if st := e.op(http.MethodGet, "/api/v1/tasks/"+h.HealthTaskID, nil, &tk); st != http.StatusOK {
		t.Fatalf("show task: HTTP %d", st)
	}
	if h.LastFailureCorrelationID != tk.CorrelationID {
		t.Errorf("last failure cid %q, probe's %q", h.LastFailureCorrelationID, tk.CorrelationID)
	}
	var audited bool
	for _, a := range e.auditByCID(tk.CorrelationID) {
		audited = audited || (a.Action == "host.health" && a.Result == "unhealthy" && a.Target == id &&
			strings.Contains(a.Detail, "from=healthy"))
	}
	if !audited {
		t.Fatalf("no host.health audit record under %s: %+v", tk.CorrelationID, e.auditByCID(tk.CorrelationID))
	}
	if fleet := e.dashboardGet("/ui/fleet"); !regexp.MustCompile(`id="host-` + id + `"[\s\S]*?class="health bad" data-health="unhealthy"`).MatchString(fleet) {
		t.Errorf("fleet row shows no unhealthy health:\n%s", fleet)
	}
	if live := e.dashboardGet("/ui/hosts/" + id + "/live"); !strings.Contains(live, `id="host-health"`) ||
		!strings.Contains(live, ">unhealthy</strong>") {
		t.Errorf("host live block shows no unhealthy health:\n%s", live)
	}

	rep := e.runPreflight(preflight.Config{NodeID: id})
	r := pfHop(rep, signal.HopNodeRecoveryStatus)
	if r.Signal != signal.HealthProbeUnhealthy || !strings.Contains(r.Detail, "kvm_missing") {
		t.Errorf("node_recovery_status %+v", r)
	}
	if hb := pfHop(rep, signal.HopNodeHeartbeat); hb.Data["health"] != "unhealthy" {
		t.Errorf("node_heartbeat data %+v", hb.Data)
	}

	healthy.Store(true)
	h = e.waitHealth(id, api.HealthHealthy, h.HealthTaskID, 15*time.Second)
	var back bool
	if st := e.op(http.MethodGet, "/api/v1/tasks/"+h.HealthTaskID, nil, &tk); st != http.StatusOK {
		t.Fatalf("show task: HTTP %d", st)
	}
	for _, a := range e.auditByCID(tk.CorrelationID) {
		back = back || (a.Action == "host.health" && a.Result == "healthy" && strings.Contains(a.Detail, "from=unhealthy"))
	}
	if !back {
		t.Error("the change back to healthy was not audited")
	}
	if n := runs.Load(); n > 40 {
		t.Errorf("%d probes in the test: more than one a second", n)
	}
}
