package dashboard

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func ev(seq int64, d time.Duration, phase api.InstancePhase, reason api.ReasonCode, desired api.DesiredState, actor string) api.InstanceEvent {
	return api.InstanceEvent{InstanceID: "i-1", Seq: seq, At: t0.Add(d), Phase: phase, ReasonCode: reason,
		DesiredState: desired, Generation: 1, Actor: actor}
}

func TestInstanceFilterMatch(t *testing.T) {
	in := api.Instance{ID: "i-abc", Name: "web-1", Group: "web", HostID: "h1", DesiredState: api.DesiredRunning,
		Phase: api.InstanceFailed, ReasonCode: api.ReasonOOMKilled}
	for _, c := range []struct {
		name string
		f    instFilter
		want bool
	}{
		{"no filter", instFilter{}, true},
		{"phase", instFilter{Phase: "Failed"}, true},
		{"other phase", instFilter{Phase: "Ready"}, false},
		{"desired", instFilter{Desired: "running"}, true},
		{"other desired", instFilter{Desired: "stopped"}, false},
		{"search name", instFilter{Q: "WEB-1"}, true},
		{"search reason", instFilter{Q: "oom"}, true},
		{"search miss", instFilter{Q: "db"}, false},
		{"all", instFilter{Phase: "Failed", Desired: "running", Q: "i-abc"}, true},
	} {
		if got := c.f.match(in); got != c.want {
			t.Errorf("%s: match = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestHealthOf(t *testing.T) {
	hc := &api.HealthCheck{Interval: api.Duration(5 * time.Second), FailureThreshold: 2}
	for _, c := range []struct {
		name string
		in   api.Instance
		want string
	}{
		{"ready with checks", api.Instance{Phase: api.InstanceReady, Spec: api.InstanceSpec{HealthCheck: hc}}, "passing"},
		{"ready without checks", api.Instance{Phase: api.InstanceReady}, "passing"},
		{"failed health check", api.Instance{Phase: api.InstanceFailed, ReasonCode: api.ReasonHealthcheckFailed}, "failing"},
		{"failed otherwise", api.Instance{Phase: api.InstanceFailed, ReasonCode: api.ReasonOOMKilled}, "unknown"},
		{"booting", api.Instance{Phase: api.InstanceBooting}, "unknown"},
		{"stopped", api.Instance{Phase: api.InstanceStopped}, "unknown"},
	} {
		if got := healthOf(c.in).State; got != c.want {
			t.Errorf("%s: health %q, want %q", c.name, got, c.want)
		}
	}
	r := instRow{Instance: api.Instance{Spec: api.InstanceSpec{HealthCheck: hc, Readiness: api.Readiness{SerialMarker: "up", TCPPort: 22}}}}
	if got := r.HealthCheckText(); got != "every 5s, failed after 2 in a row" {
		t.Errorf("health check text %q", got)
	}
	if got := r.ReadinessText(); got != `serial marker "up" and TCP port 22 accepts (timeout 5m0s)` {
		t.Errorf("readiness text %q", got)
	}
	if got := (instRow{}).HealthCheckText(); got != "none" {
		t.Errorf("no health check: %q", got)
	}
}

func TestSpansOf(t *testing.T) {
	evs := []api.InstanceEvent{
		ev(1, 0, api.InstancePending, "", api.DesiredRunning, "operator:a"),
		ev(2, time.Second, api.InstanceBooting, "", api.DesiredRunning, "node:h1"),
		ev(3, 3*time.Second, api.InstanceReady, "", api.DesiredRunning, "node:h1"),
		ev(4, 5*time.Second, api.InstanceReady, "", api.DesiredStopped, "operator:a"), // desired change: Ready goes on
		ev(5, 6*time.Second, api.InstanceStopped, api.ReasonTerminatedByOperator, api.DesiredStopped, "node:h1"),
	}
	var got []string
	for _, s := range spansOf(evs, t0.Add(10*time.Second)) {
		got = append(got, string(s.Phase)+" "+s.To.Sub(s.From).String())
	}
	if want := "Pending 1s,Booting 2s,Ready 3s,Stopped 4s"; strings.Join(got, ",") != want {
		t.Errorf("spans %v, want %s", got, want)
	}
	// A clock behind the last event: the last span ends where it starts.
	if sp := spansOf(evs[:1], t0.Add(-time.Minute)); len(sp) != 1 || !sp[0].To.Equal(t0) {
		t.Errorf("clock behind: %+v", sp)
	}
}

func TestPhaseTimeline(t *testing.T) {
	if got := phaseTimeline(nil, t0); got != "" {
		t.Errorf("no events: %q", got)
	}
	evs := []api.InstanceEvent{
		ev(1, 0, api.InstancePending, "", api.DesiredRunning, "operator:<a>"),
		ev(2, time.Second, api.InstanceFailed, api.ReasonHealthcheckFailed, api.DesiredRunning, "node:h1"),
	}
	evs[1].Message = `<script>x</script>`
	svg := string(phaseTimeline(evs, t0.Add(4*time.Second)))
	if strings.Contains(svg, "<script>") || strings.Contains(svg, "operator:<a>") || !strings.Contains(svg, "&lt;script&gt;") {
		t.Errorf("text not escaped: %s", svg)
	}
	// Every phase has a labelled lane; each span is in its phase's lane
	// with its class, a title naming it, and a width scaled to its time.
	for _, p := range instancePhases {
		if !strings.Contains(svg, ">"+string(p)+"</text>") {
			t.Errorf("no lane label %s", p)
		}
	}
	spans := regexp.MustCompile(`<g class="span" data-phase="(\w+)"><title>([^<]*)</title><rect x="(\d+)" y="(\d+)" width="(\d+)"[^>]*class="ph ph-(\w+)"`).FindAllStringSubmatch(svg, -1)
	var got []string
	for _, m := range spans {
		got = append(got, strings.Join(m[1:], "|"))
	}
	want := []string{
		"Pending|Pending: 12:00:00.000 to 12:00:01.000 (1s), by operator:&lt;a&gt;|80|3|130|pending",
		"Failed|Failed (healthcheck_failed): 12:00:01.000 to 12:00:04.000 (3s), by node:h1: &lt;script&gt;x&lt;/script&gt;|210|103|390|failed",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("spans:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(svg, `role="img"`) || !strings.Contains(svg, "2 transitions from 12:00:00 to 12:00:04 (4s)") {
		t.Errorf("timeline not labelled: %s", svg)
	}
}

// newInstanceServer is a dashboard over a fake API with host h1 and the
// instance i-1 ("web-1"), tokens "op" and "view" (roles enforced like the
// API's), recording the API calls.
func newInstanceServer(t *testing.T) (*httptest.Server, func() []string) {
	var mu sync.Mutex
	var calls []string
	role := map[string]api.Role{"Bearer op": api.RoleOperator, "Bearer view": api.RoleViewer}
	need := func(min api.Role, h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !role[r.Header.Get("Authorization")].AtLeast(min) {
				httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(403, "forbidden", "requires role %s", min))
				return
			}
			mu.Lock()
			calls = append(calls, r.Method+" "+r.URL.RequestURI())
			mu.Unlock()
			h(w, r)
		}
	}
	now := time.Now().UTC()
	in := api.Instance{ID: "i-1", Name: "web-1", HostID: "h1", DesiredState: api.DesiredRunning, Generation: 2,
		Phase: api.InstanceFailed, ReasonCode: api.ReasonHealthcheckFailed, Message: "3 checks failed", ObservedGeneration: 1,
		StatusAt: &now, CreatedAt: now, UpdatedAt: now,
		Spec: api.InstanceSpec{Image: api.Artifact{URL: "https://img/x.qcow2"}, VCPUs: 2, MemoryMiB: 1024, DiskGiB: 8,
			Network:     api.NetworkSpec{Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22}, {Name: "web", GuestPort: 80}}},
			HealthCheck: &api.HealthCheck{}},
		Runtime: &api.InstanceRuntime{Runtime: "mock", Accel: "tcg", Ports: map[string]int{"ssh": 40022}, Restarts: 3}}
	other := api.Instance{ID: "i-2", Name: "db-1", HostID: "h2", DesiredState: api.DesiredStopped, Generation: 1,
		ObservedGeneration: 1, Phase: api.InstanceStopped}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/hosts", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []api.Host{{ID: "h1", Status: api.HostHealthy}})
	})
	mux.HandleFunc("GET /api/v1/instances", need(api.RoleViewer, func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []api.Instance{other, in})
	}))
	mux.HandleFunc("GET /api/v1/instances/{id}", need(api.RoleViewer, func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "i-1" {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(404, "instance_not_found", "no instance"))
			return
		}
		httpapi.WriteJSON(w, 200, in)
	}))
	mux.HandleFunc("GET /api/v1/instances/{id}/events", need(api.RoleViewer, func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []api.InstanceEvent{
			ev(1, 0, api.InstancePending, "", api.DesiredRunning, "operator:alice"),
			ev(2, time.Second, api.InstanceReady, "", api.DesiredRunning, "node:h1"),
			ev(3, 2*time.Second, api.InstanceFailed, api.ReasonHealthcheckFailed, api.DesiredRunning, "node:h1")})
	}))
	mux.HandleFunc("GET /api/v1/allocations", need(api.RoleViewer, func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []api.Allocation{{ID: "a-1", Kind: api.AllocationInstance, InstanceID: "i-1", HostID: "h1",
			ProvisionTaskID: "tsk_prov"}})
	}))
	mux.HandleFunc("GET /api/v1/allocations/{id}/sessions", need(api.RoleViewer, func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []api.TerminalSession{{ID: "ts-rec", Mode: "serial", RecordingURL: "/api/v1/terminal-sessions/ts-rec/recording",
			RecordingBytes: 512, CreatedAt: now}, {ID: "ts-none", Mode: "serial", CreatedAt: now}})
	}))
	mux.HandleFunc("GET /api/v1/audit", need(api.RoleViewer, func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []api.AuditEvent{{At: now, Actor: "operator:alice", Action: "instance.create", Target: "i-1", CorrelationID: "cid-c"}})
	}))
	for _, a := range []string{"start", "stop"} {
		mux.HandleFunc("POST /api/v1/instances/{id}/"+a, need(api.RoleOperator, func(w http.ResponseWriter, r *http.Request) {
			httpapi.WriteJSON(w, 200, in)
		}))
	}
	mux.HandleFunc("DELETE /api/v1/instances/{id}", need(api.RoleOperator, func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 202, in)
	}))
	u := New(Config{API: mux, Authenticate: func(_ context.Context, tok string) (httpapi.Principal, error) {
		if r, ok := role["Bearer "+tok]; ok {
			return httpapi.Principal{Name: tok, Role: r}, nil
		}
		return httpapi.Principal{}, httpapi.Errorf(401, "operator_token_invalid", "no")
	}})
	m := http.NewServeMux()
	for _, rt := range u.Routes() {
		m.Handle(rt.Pattern, rt.Handler)
	}
	ts := httptest.NewServer(m)
	t.Cleanup(ts.Close)
	return ts, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), calls...)
	}
}

func TestInstancesPage(t *testing.T) {
	ts, calls := newInstanceServer(t)
	c, _ := login(t, ts, "view")
	for _, tc := range []struct {
		name, query string
		rows        []string // instance ids shown, in order
		apiQuery    string
	}{
		{"all", "", []string{"i-2", "i-1"}, "GET /api/v1/instances"},
		{"host goes to the API", "?host=h1", []string{"i-2", "i-1"}, "GET /api/v1/instances?host=h1"},
		{"phase", "?phase=Failed", []string{"i-1"}, "GET /api/v1/instances"},
		{"desired", "?desired=stopped", []string{"i-2"}, "GET /api/v1/instances"},
		{"search", "?q=WEB", []string{"i-1"}, "GET /api/v1/instances"},
		{"nothing", "?q=nope", nil, "GET /api/v1/instances"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, body := get(t, c, ts.URL+"/ui/instances"+tc.query)
			if st != 200 {
				t.Fatalf("HTTP %d", st)
			}
			var got []string
			for _, m := range regexp.MustCompile(`<tr id="instance-([^"]+)"`).FindAllStringSubmatch(body, -1) {
				got = append(got, m[1])
			}
			if strings.Join(got, ",") != strings.Join(tc.rows, ",") {
				t.Errorf("rows %v, want %v", got, tc.rows)
			}
			if cs := calls(); cs[len(cs)-1] != tc.apiQuery {
				t.Errorf("API call %q, want %q", cs[len(cs)-1], tc.apiQuery)
			}
		})
	}
	_, body := get(t, c, ts.URL+"/ui/instances")
	for _, want := range []string{`href="/ui/instances/i-1"`, `href="/ui/hosts/h1"`, "1/2 <span class=\"bad\">behind</span>",
		"1/1 <span class=\"ok\">converged</span>", "<code class=\"reason\">healthcheck_failed</code>", "mock / tcg",
		"every 10s, failed after 3 in a row", `href="/ui/instances"`} {
		if !strings.Contains(body, want) {
			t.Errorf("instances page lacks %s", want)
		}
	}
}

func TestInstancePage(t *testing.T) {
	ts, _ := newInstanceServer(t)
	op, _ := login(t, ts, "op")
	st, body := get(t, op, ts.URL+"/ui/instances/i-1")
	if st != 200 {
		t.Fatalf("instance page: %d %s", st, body)
	}
	for _, want := range []string{
		`id="desired-state">running`, `id="actual-phase"><span class="status ph-Failed">Failed</span>`, `id="converged">behind`,
		"https://img/x.qcow2", "1024 MiB", "8 GiB", "<th scope=\"row\">ssh</th><td>22</td><td>40022</td>",
		"<th scope=\"row\">web</th><td>80</td><td>not assigned yet</td>", `class="health-failing"><strong>failing</strong>`,
		`id="phase-timeline"`, `data-phase="Failed"`, "node:h1", "operator:alice",
		`href="/ui/allocations?instance_id=i-1"`, `href="/ui/sessions/ts-rec/replay"`, `href="/ui/tasks/tsk_prov"`,
		`href="/ui/audit?target=i-1"`, `id="act-stop"`, `id="act-start"`, `id="act-delete"`, "instance.create",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("instance page lacks %s", want)
		}
	}
	if strings.Contains(body, "ts-none") {
		t.Error("a session without a recording is listed as a log")
	}
	view, _ := login(t, ts, "view")
	_, body = get(t, view, ts.URL+"/ui/instances/i-1")
	for _, ctl := range []string{"act-stop", "act-start", "act-delete", "/actions/"} {
		if strings.Contains(body, ctl) {
			t.Errorf("a viewer sees the action control %s", ctl)
		}
	}
	if !strings.Contains(body, `id="phase-timeline"`) {
		t.Error("a viewer does not see the timeline")
	}
	if st, _ := get(t, op, ts.URL+"/ui/instances/i-nope"); st != 404 {
		t.Errorf("unknown instance: %d, want 404", st)
	}
}

func TestInstanceActions(t *testing.T) {
	ts, calls := newInstanceServer(t)
	op, opCSRF := login(t, ts, "op")
	view, viewCSRF := login(t, ts, "view")
	noFollow := func(c *http.Client) *http.Client {
		n := *c
		n.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		return &n
	}
	for _, tc := range []struct {
		name     string
		c        *http.Client
		action   string
		form     url.Values
		status   int
		location string // a prefix
		apiCall  string // the last API call it must make, "" for none
	}{
		{"viewer stop", view, "stop", url.Values{"csrf": {viewCSRF}}, 403, "", ""},
		{"no csrf", op, "stop", url.Values{}, 403, "", ""},
		{"stop", op, "stop", url.Values{"csrf": {opCSRF}}, 303, "/ui/instances/i-1?done=stop+requested", "POST /api/v1/instances/i-1/stop"},
		{"start", op, "start", url.Values{"csrf": {opCSRF}}, 303, "/ui/instances/i-1?done=start+requested", "POST /api/v1/instances/i-1/start"},
		{"delete unconfirmed", op, "delete", url.Values{"csrf": {opCSRF}, "confirm": {"i-1"}}, 400, "", ""},
		{"delete confirmed", op, "delete", url.Values{"csrf": {opCSRF}, "confirm": {" web-1 "}}, 303, "/ui/instances/i-1?done=delete+requested",
			"DELETE /api/v1/instances/i-1"},
		{"unknown action", op, "reboot", url.Values{"csrf": {opCSRF}}, 404, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(calls())
			resp, err := noFollow(tc.c).PostForm(ts.URL+"/ui/instances/i-1/actions/"+tc.action, tc.form)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Location"), tc.location) {
				t.Fatalf("HTTP %d Location %q, want %d %q", resp.StatusCode, resp.Header.Get("Location"), tc.status, tc.location)
			}
			var changed []string
			for _, c := range calls()[before:] {
				if !strings.HasPrefix(c, "GET ") {
					changed = append(changed, c)
				}
			}
			switch {
			case tc.apiCall == "" && len(changed) > 0:
				t.Errorf("changing API calls %v, want none", changed)
			case tc.apiCall != "" && (len(changed) != 1 || changed[0] != tc.apiCall):
				t.Errorf("changing API calls %v, want [%s]", changed, tc.apiCall)
			}
		})
	}
	_, body := get(t, op, ts.URL+"/ui/instances/i-1?done=stop+requested")
	if !strings.Contains(body, `id="action-done"`) {
		t.Error("the outcome is not shown")
	}
}
