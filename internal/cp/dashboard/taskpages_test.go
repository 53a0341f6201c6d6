package dashboard

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

func TestPhaseChart(t *testing.T) {
	if got := phaseChart(nil); got != "" {
		t.Errorf("no phases: %q", got)
	}
	svg := string(phaseChart([]phase{{Label: `<script>alert("x")</script>`, MS: 50}, {Label: "boot", MS: 200},
		{Label: "tiny", MS: 0}, {Label: "a&b", MS: 1}}))
	if strings.Contains(svg, "<script>") || !strings.Contains(svg, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") ||
		!strings.Contains(svg, "a&amp;b") {
		t.Errorf("labels not escaped: %s", svg)
	}
	widths := regexp.MustCompile(`<rect [^>]*width="(\d+)"[^>]*data-ms="(\d+)"`).FindAllStringSubmatch(svg, -1)
	var got []string
	for _, m := range widths {
		got = append(got, m[2]+":"+m[1])
	}
	// The longest phase fills the bar area; a 1 ms phase gets at least 1 px; 0 ms none.
	if want := "50:75 200:300 0:0 1:1"; strings.Join(got, " ") != want {
		t.Errorf("bar widths %v, want %s", got, want)
	}
	if !strings.Contains(svg, `role="img"`) || !strings.Contains(svg, "4 phases, 251 ms in all") {
		t.Errorf("chart is not labelled: %s", svg)
	}
	if barWidth(5, 0) != 0 || barWidth(7, 7) != chartBarW {
		t.Error("barWidth edges")
	}
}

func TestPhasesAndHistory(t *testing.T) {
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	tk := api.Task{CreatedAt: at, DispatchedAt: &at, FinishedAt: &at, State: api.TaskSucceeded, Attempts: 1,
		Events: []api.TaskEvent{{Phase: "started", At: at}, {Phase: "kvm", Status: "succeeded", DurationMS: 12, At: at}},
		Result: &api.TaskResult{Timings: map[string]int64{"total_ms": 40, "boot_ms": 30}}}
	var got []string
	for _, p := range phasesOf(tk) {
		got = append(got, p.Label)
	}
	if strings.Join(got, ",") != "boot,total,event kvm" {
		t.Errorf("phases %v", got)
	}
	got = nil
	for _, s := range historyOf(tk) {
		got = append(got, s.State)
	}
	if strings.Join(got, ",") != "queued,dispatched,running,,succeeded" {
		t.Errorf("history %v", got)
	}
}

// newPagesServer is a dashboard over a fake API with a host, tasks and
// audit records; queries records the API queries it was asked.
func newPagesServer(t *testing.T) (*httptest.Server, *[]string) {
	var queries []string
	now := time.Now().UTC()
	apiMux := http.NewServeMux()
	apiMux.HandleFunc("GET /api/v1/hosts", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []api.Host{{ID: "h1", Status: api.HostHealthy}})
	})
	apiMux.HandleFunc("GET /api/v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		httpapi.WriteJSON(w, 200, []api.Task{{ID: "tsk_1", NodeID: "h1", Type: "diag.echo", State: api.TaskSucceeded,
			CorrelationID: "cid-1", CreatedAt: now, FinishedAt: &now}})
	})
	apiMux.HandleFunc("GET /api/v1/task-types", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []string{"diag.echo", "diag.health_probe"})
	})
	apiMux.HandleFunc("GET /api/v1/tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "tsk_1" {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(404, "not_found", "no task"))
			return
		}
		httpapi.WriteJSON(w, 200, api.Task{ID: "tsk_1", NodeID: "h1", Type: "diag.echo", State: api.TaskSucceeded,
			Params: json.RawMessage(`{"message":"<hi>"}`), CorrelationID: "cid-1", CreatedAt: now, FinishedAt: &now,
			Envelope: &api.TaskEnvelope{KID: "kid-7", IssuedAt: 1700000000, Expires: 1700000600, Audience: "h1"},
			Result: &api.TaskResult{Status: "succeeded", Output: json.RawMessage(`{"echo":"<hi>"}`),
				Timings: map[string]int64{"echo_ms": 3}}})
	})
	apiMux.HandleFunc("GET /api/v1/audit", func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		if r.URL.Query().Get("format") == "jsonl" {
			w.Header().Set("Content-Type", "application/x-ndjson")
			_, _ = w.Write([]byte(`{"id":1,"action":"task.enqueue","correlation_id":"cid-1"}` + "\n"))
			return
		}
		httpapi.WriteJSON(w, 200, []api.AuditEvent{{ID: 1, At: now, Actor: "operator:alice", ActorRole: api.RoleOperator,
			Action: "task.enqueue", Target: "tsk_1", CorrelationID: "cid-1"}})
	})
	u := New(Config{API: apiMux, Authenticate: func(_ context.Context, tok string) (httpapi.Principal, error) {
		if tok == "view" {
			return httpapi.Principal{Name: "bob", Role: api.RoleViewer}, nil
		}
		return httpapi.Principal{Name: "alice", Role: api.RoleOperator}, nil
	}})
	mux := http.NewServeMux()
	for _, rt := range u.Routes() {
		mux.Handle(rt.Pattern, rt.Handler)
	}
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts, &queries
}

func TestTaskPages(t *testing.T) {
	ts, queries := newPagesServer(t)
	if st, body := get(t, http.DefaultClient, ts.URL+"/ui/tasks"); st != 200 || !strings.Contains(body, `id="token"`) {
		t.Errorf("tasks without a session: %d, want the login page", st)
	}
	c, _ := login(t, ts, "op")
	st, body := get(t, c, ts.URL+"/ui/tasks?type=diag.echo&state=succeeded&node_id=h1")
	if st != 200 || !strings.Contains(body, `href="/ui/tasks/tsk_1"`) || !strings.Contains(body, `<option selected>diag.echo</option>`) {
		t.Fatalf("tasks page: %d %s", st, body)
	}
	if q := (*queries)[len(*queries)-1]; q != "limit=200&node_id=h1&state=succeeded&type=diag.echo" {
		t.Errorf("tasks API query %q", q)
	}
	for _, nav := range []string{`href="/ui/fleet"`, `href="/ui/tasks"`, `href="/ui/audit"`} {
		if !strings.Contains(body, nav) {
			t.Errorf("nav lacks %s", nav)
		}
	}
	st, body = get(t, c, ts.URL+"/ui/tasks/tsk_1")
	for _, want := range []string{`id="phase-chart"`, "kid-7", "1700000000", "1700000600", `href="/ui/evidence/cid-1"`,
		"&#34;message&#34;: &#34;\\u003chi\\u003e&#34;", "echo_ms", "<strong>succeeded</strong>"} {
		if !strings.Contains(body, want) {
			t.Errorf("task page lacks %s", want)
		}
	}
	if st != 200 || strings.Contains(body, "<hi>") {
		t.Errorf("task page: %d (unescaped output?)", st)
	}
	if st, _ := get(t, c, ts.URL+"/ui/tasks/nope"); st != 404 {
		t.Errorf("unknown task: %d, want 404", st)
	}
	v, _ := login(t, ts, "view")
	if _, body := get(t, v, ts.URL+"/ui/tasks/tsk_1"); strings.Contains(body, "/ui/evidence/") {
		t.Error("a viewer's task page links the evidence bundle (operator only)")
	}
}

func TestAuditPageAndExport(t *testing.T) {
	ts, queries := newPagesServer(t)
	c, _ := login(t, ts, "view")
	st, body := get(t, c, ts.URL+"/ui/audit?actor=operator:alice&role=operator&action=task.enqueue&target=tsk_1&since=2024-01-02T03:04&until=2024-01-03T00:00:00Z")
	if st != 200 || !strings.Contains(body, "cid-1") || !strings.Contains(body, `id="audit-export"`) {
		t.Fatalf("audit page: %d %s", st, body)
	}
	want := "action=task.enqueue&actor=operator%3Aalice&limit=200&role=operator&since=2024-01-02T03%3A04%3A00Z&target=tsk_1&until=2024-01-03T00%3A00%3A00Z"
	if q := (*queries)[len(*queries)-1]; q != want {
		t.Errorf("audit API query %q, want %q", q, want)
	}
	href := regexp.MustCompile(`id="audit-export" href="([^"]+)"`).FindStringSubmatch(body)
	if href == nil {
		t.Fatal("no export link")
	}
	resp, err := c.Get(ts.URL + strings.ReplaceAll(href[1], "&amp;", "&"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ev api.AuditEvent
	if err := json.NewDecoder(resp.Body).Decode(&ev); err != nil || resp.StatusCode != 200 ||
		resp.Header.Get("Content-Type") != "application/x-ndjson" || ev.CorrelationID != "cid-1" {
		t.Errorf("export: %d %q %+v %v", resp.StatusCode, resp.Header.Get("Content-Type"), ev, err)
	}
	if q := (*queries)[len(*queries)-1]; !strings.Contains(q, "format=jsonl") || !strings.Contains(q, "actor=operator%3Aalice") ||
		!strings.Contains(q, "since=2024-01-02T03%3A04%3A00Z") {
		t.Errorf("export API query %q", q)
	}
}
