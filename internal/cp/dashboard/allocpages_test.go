package dashboard

import (
	"context"
	"encoding/json"
	"html"
	"io"
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
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// allocAPI is a fake operator API for the allocation pages: allocation
// a1 (active, one ready and one failed session) and a2 (failed); terminal
// tokens and recordings for operators only, as the real API.
type allocAPI struct {
	mu    sync.Mutex
	mints []string // "<allocation> <cols>x<rows> <correlation id>"
	query []string // the allocation list's queries
}

func (f *allocAPI) handler() http.Handler {
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	seven := 7
	allocs := map[string]api.Allocation{
		"a1": {ID: "a1", Kind: api.AllocationHost, Username: "alice", HostID: "h1", State: api.AllocationActive,
			ProvisionTaskID: "tsk_prov", CreatedAt: at, UpdatedAt: at},
		"a2": {ID: "a2", Kind: api.AllocationHost, Username: "bob", HostID: "h1", State: api.AllocationFailed,
			StateReason: "useradd_failed: exit 9", CreatedAt: at, UpdatedAt: at},
		// a3 is an active GPU slice: its terminal is brokered SSH into the
		// slice VM; its workflow has run to active.
		"a3": {ID: "a3", Kind: api.AllocationSlice, Username: "carol", HostID: "h1", State: api.AllocationActive,
			CreatedAt: at, UpdatedAt: at, Workflow: &api.SliceWorkflow{Status: "active", Step: "provision_user",
				VMName: "slice-a3", NUMA: "node 0", ProvisionTaskID: "tsk_vm",
				Steps: []api.SliceWorkflowStep{
					{Step: "lease_slots", State: "done", IdempotencyKey: "a3/lease_slots", StartedAt: at, DurationMS: 12},
					{Step: "await_provision", State: "done", IdempotencyKey: "a3/await_provision", TaskID: "tsk_vm", StartedAt: at, DurationMS: 41250, Detail: "<i>ok</i>"}},
				Phases: []api.SlicePhase{{Phase: "readiness", Status: "ok", DurationMS: 30500}},
				VM: &api.SliceVM{PrivateIP: "10.77.0.10", SSHHost: "127.0.0.1", SSHPort: 40022, Ready: true,
					ConsoleModel: "gateway_required",
					Performance:  json.RawMessage(`{"accel":"tcg","boot_to_ready_ms":30500,"guest":{"cpu_loop_ms":812,"mem_mib_per_s":1234567,"gpus":["GPU-1"]}}`),
					Readiness:    json.RawMessage(`{"ssh":true,"telemetry_ready":true}`)}}},
		// a4 is a slice whose workflow failed.
		"a4": {ID: "a4", Kind: api.AllocationSlice, Username: "dave", HostID: "h1", State: api.AllocationFailed,
			CreatedAt: at, UpdatedAt: at, Workflow: &api.SliceWorkflow{Status: "failed", Step: "await_provision",
				FailedStep: "await_provision", Signal: "slice_vm_provision_failed", Error: "readiness timed out", CorrelationID: "cid_wf"}},
	}
	ev := func(st terminal.State, ms int64, detail string) api.TerminalStateEvent {
		return api.TerminalStateEvent{State: string(st), At: at.Add(time.Duration(ms) * time.Millisecond), ElapsedMS: ms, Detail: detail}
	}
	sessions := []api.TerminalSession{
		{ID: "ts_ok", AllocationID: "a1", NodeID: "h1", Username: "alice", Mode: "pty", State: "pty_ready",
			States: []api.TerminalStateEvent{ev(terminal.StateTokenReady, 0, ""), ev(terminal.StateBrowserWSReady, 12, ""),
				ev(terminal.StateTerminalOpenSent, 15, ""), ev(terminal.StateNodeStreamConnected, 90, ""), ev(terminal.StatePTYReady, 101, "")},
			CorrelationID: "cid_ok", Cols: 80, Rows: 24, CreatedAt: at, ClosedAt: &at, ExitCode: &seven, CloseReason: "exit",
			RecordingBytes: 321, RecordingURL: "/api/v1/terminal-sessions/ts_ok/recording"},
		{ID: "ts_bad", AllocationID: "a1", NodeID: "h1", Username: "alice", Mode: "pty", State: "failed",
			States: []api.TerminalStateEvent{ev(terminal.StateTokenReady, 0, ""), ev(terminal.StateBrowserWSReady, 9, ""),
				ev(terminal.StateTerminalOpenSent, 11, ""), ev(terminal.StateFailed, 5011, "node_stream_timeout")},
			ErrorCode: "node_stream_timeout", ErrorMessage: "no node stream within 5s <b>", Signal: "terminal_node_stream_timeout",
			CorrelationID: "cid_bad", CreatedAt: at, ClosedAt: &at, CloseReason: "node_stream_timeout", ExitCode: nil},
	}
	mux := http.NewServeMux()
	operator := func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer op" }
	mux.HandleFunc("GET /api/v1/hosts", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteJSON(w, 200, []api.Host{{ID: "h1", OSFamily: "linux", Status: api.HostHealthy}})
	})
	mux.HandleFunc("GET /api/v1/allocations", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.query = append(f.query, r.URL.RawQuery)
		f.mu.Unlock()
		var out []api.Allocation
		for _, id := range []string{"a1", "a2", "a3"} {
			if st := r.URL.Query().Get("state"); st == "" || st == string(allocs[id].State) {
				out = append(out, allocs[id])
			}
		}
		httpapi.WriteJSON(w, 200, out)
	})
	mux.HandleFunc("GET /api/v1/allocations/{id}", func(w http.ResponseWriter, r *http.Request) {
		a, ok := allocs[r.PathValue("id")]
		if !ok {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(404, "allocation_not_found", "no such allocation"))
			return
		}
		httpapi.WriteJSON(w, 200, a)
	})
	mux.HandleFunc("GET /api/v1/allocations/{id}/sessions", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "a1" {
			httpapi.WriteJSON(w, 200, []api.TerminalSession{})
			return
		}
		httpapi.WriteJSON(w, 200, sessions)
	})
	mux.HandleFunc("GET /api/v1/terminal-sessions/{sid}", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, sessions[0])
	})
	mux.HandleFunc("GET /api/v1/terminal-sessions/{sid}/recording", func(w http.ResponseWriter, r *http.Request) {
		if !operator(r) {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(403, "forbidden", "requires role operator"))
			return
		}
		w.Header().Set("Content-Type", "application/x-asciicast")
		_, _ = io.WriteString(w, `{"version":2,"width":80,"height":24}`+"\n"+`[0.1,"o","hi\r\n"]`+"\n")
	})
	mux.HandleFunc("POST /api/v1/allocations/{id}/terminal-token", func(w http.ResponseWriter, r *http.Request) {
		var req api.TerminalTokenRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.mints = append(f.mints, r.PathValue("id")+" "+strconvSize(req)+" "+httpapi.CorrelationID(r.Context()))
		f.mu.Unlock()
		if !operator(r) {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(403, "forbidden", "requires role operator"))
			return
		}
		if r.PathValue("id") != "a1" {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(409, "allocation_not_active", "allocation is failed"))
			return
		}
		httpapi.WriteJSON(w, 200, api.TerminalToken{Token: "tok-1", SessionID: "ts_new", AllocationID: "a1",
			URL: "/api/v1/terminal?allocation_id=a1", Subprotocol: terminal.Subprotocol})
	})
	return httpapi.WithCorrelation(mux)
}

func strconvSize(r api.TerminalTokenRequest) string {
	b, _ := json.Marshal([]int{r.Cols, r.Rows})
	return string(b)
}

func newAllocServer(t *testing.T) (*httptest.Server, *allocAPI) {
	f := &allocAPI{}
	u := New(Config{API: f.handler(), Authenticate: func(_ context.Context, tok string) (httpapi.Principal, error) {
		switch tok {
		case "op":
			return httpapi.Principal{Name: "alice", Role: api.RoleOperator}, nil
		case "view":
			return httpapi.Principal{Name: "bob", Role: api.RoleViewer}, nil
		}
		return httpapi.Principal{}, httpapi.Errorf(401, "operator_token_invalid", "no")
	}})
	mux := http.NewServeMux()
	for _, rt := range u.Routes() {
		mux.Handle(rt.Pattern, rt.Handler)
	}
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts, f
}

func TestAllocationsList(t *testing.T) {
	ts, f := newAllocServer(t)
	c, _ := login(t, ts, "op")
	st, body := get(t, c, ts.URL+"/ui/allocations?host_id=h1&state=failed&instance_id=")
	if st != 200 || !strings.Contains(body, `href="/ui/allocations/a2"`) || strings.Contains(body, `id="alloc-a1"`) {
		t.Fatalf("filtered list: %d %s", st, body)
	}
	if !strings.Contains(body, "useradd_failed: exit 9") || !strings.Contains(body, `href="/ui/hosts/h1"`) {
		t.Errorf("list lacks the state reason or the host link: %s", body)
	}
	if q := f.query[len(f.query)-1]; q != "host_id=h1&state=failed" {
		t.Errorf("API query %q", q)
	}
	_, body = get(t, c, ts.URL+"/ui/allocations")
	if !strings.Contains(body, `href="/ui/allocations/a1/terminal"`) || !strings.Contains(body, `href="/ui/allocations/a3/terminal"`) ||
		strings.Count(body, "Open terminal") != 2 {
		t.Errorf("an operator gets Open terminal for the active allocations only (a host's and a slice's): %s", body)
	}
	if !strings.Contains(body, `<a href="/ui/allocations">Allocations</a>`) {
		t.Error("the nav has no Allocations link")
	}
}

func TestAllocationPageChains(t *testing.T) {
	ts, _ := newAllocServer(t)
	c, _ := login(t, ts, "op")
	st, body := get(t, c, ts.URL+"/ui/allocations/a1")
	if st != 200 {
		t.Fatalf("allocation page: %d %s", st, body)
	}
	for _, want := range []string{`href="/ui/tasks/tsk_prov"`, `id="open-terminal"`,
		`href="/ui/sessions/ts_ok/replay"`, "exit code <span class=\"s-exit\">7</span>",
		`<code class="s-signal">terminal_node_stream_timeout</code>`, `<code class="s-code">node_stream_timeout</code>`,
		"no node stream within 5s &lt;b&gt;", "after terminal_open_sent", "cid_bad", "5.011s",
		"docs/runbooks/preflight.md#terminal-readiness"} {
		if !strings.Contains(body, want) {
			t.Errorf("allocation page lacks %q", want)
		}
	}
	chain := func(sid string) []string {
		art := body[strings.Index(body, `id="session-`+sid+`"`):]
		art = art[:strings.Index(art, "</ol>")]
		var out []string
		for _, m := range regexp.MustCompile(`<li data-state="([a-z_]+)" class="([a-z]+)"`).FindAllStringSubmatch(art, -1) {
			out = append(out, m[1]+":"+m[2])
		}
		return out
	}
	if got := strings.Join(chain("ts_ok"), " "); got != "token_ready:reached browser_ws_ready:reached "+
		"terminal_open_sent:reached node_stream_connected:reached pty_ready:reached" {
		t.Errorf("ready chain %s", got)
	}
	if got := strings.Join(chain("ts_bad"), " "); got != "token_ready:reached browser_ws_ready:reached "+
		"terminal_open_sent:reached node_stream_connected:missed pty_ready:missed failed:failed" {
		t.Errorf("failed chain %s", got)
	}
	if st, _ := get(t, c, ts.URL+"/ui/allocations/nope"); st != 404 {
		t.Errorf("missing allocation: %d", st)
	}
}

// TestAllocationPageSliceWorkflow: a slice allocation's page shows its
// workflow (status, steps and phases with durations, the VM, the node's
// performance and readiness figures flattened, escaped) and offers the
// brokered terminal; a failed one names the step, signal and correlation
// id.
func TestAllocationPageSliceWorkflow(t *testing.T) {
	ts, _ := newAllocServer(t)
	c, _ := login(t, ts, "op")
	st, body := get(t, c, ts.URL+"/ui/allocations/a3")
	if st != 200 {
		t.Fatalf("slice allocation page: %d %s", st, body)
	}
	for _, want := range []string{`id="wf-status" class="state">active`, `<tr data-step="await_provision" data-state="done">`,
		"41.25s", `href="/ui/tasks/tsk_vm"`, "&lt;i&gt;ok&lt;/i&gt;", `<tr data-phase="readiness">`, "30.5s",
		"10.77.0.10", "127.0.0.1:40022", "gateway_required (raw VNC: false)",
		"<td>guest.cpu_loop_ms</td><td>812</td>", "<td>guest.mem_mib_per_s</td><td>1234567</td>", "<td>guest.gpus.0</td><td>GPU-1</td>",
		"<td>telemetry_ready</td><td>true</td>", `id="open-terminal"`} {
		if !strings.Contains(body, want) {
			t.Errorf("slice allocation page lacks %q", want)
		}
	}
	_, body = get(t, c, ts.URL+"/ui/allocations/a4")
	if !strings.Contains(body, "step await_provision: <code class=\"s-signal\">slice_vm_provision_failed</code> readiness timed out") ||
		!strings.Contains(body, "cid_wf") || strings.Contains(body, `id="open-terminal"`) {
		t.Errorf("failed slice allocation page: %s", body)
	}
	_, body = get(t, c, ts.URL+"/ui/allocations/a1")
	if strings.Contains(body, `id="workflow"`) {
		t.Error("a host allocation shows a slice workflow")
	}
}

func TestTerminalPageAndMint(t *testing.T) {
	ts, f := newAllocServer(t)
	c, csrf := login(t, ts, "op")
	st, body := get(t, c, ts.URL+"/ui/allocations/a1/terminal")
	if st != 200 || !strings.Contains(body, `src="/ui/terminal.js"`) || !strings.Contains(body, `data-mint-url="/ui/allocations/a1/terminal-token"`) ||
		!strings.Contains(body, `data-csrf="`+csrf+`"`) {
		t.Fatalf("terminal page: %d %s", st, body)
	}
	m := regexp.MustCompile(`data-signals="([^"]+)"`).FindStringSubmatch(body)
	var sigs map[string]string
	if m == nil || json.Unmarshal([]byte(html.UnescapeString(m[1])), &sigs) != nil ||
		sigs["node_stream_timeout"] != "terminal_node_stream_timeout" || sigs["terminal_gateway_upgrade_failed"] != "terminal_gateway_upgrade_failed" {
		t.Errorf("signals %v", m)
	}
	resp, err := c.Get(ts.URL + "/ui/allocations/a1/terminal")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "script-src 'self' 'unsafe") {
		t.Errorf("terminal page CSP %q", csp)
	}

	mint := func(id string, form url.Values, cid string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/ui/allocations/"+id+"/terminal-token", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(api.HeaderCorrelationID, cid)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get(api.HeaderCorrelationID)
	}
	if st, _, _ := mint("a1", url.Values{"cols": {"100"}, "rows": {"30"}}, "cid_ui_nocsrf"); st != http.StatusForbidden {
		t.Errorf("mint without CSRF: %d, want 403", st)
	}
	if len(f.mints) != 0 {
		t.Fatalf("a CSRF-less POST reached the API: %v", f.mints)
	}
	st, body, cid := mint("a1", url.Values{"csrf": {csrf}, "cols": {"100"}, "rows": {"30"}}, "cid_ui_0123456789abcdef")
	var tok api.TerminalToken
	if st != 200 || json.Unmarshal([]byte(body), &tok) != nil || tok.Token != "tok-1" || tok.SessionID != "ts_new" {
		t.Fatalf("mint: %d %s", st, body)
	}
	if cid != "cid_ui_0123456789abcdef" || f.mints[0] != "a1 [100,30] cid_ui_0123456789abcdef" {
		t.Errorf("mint reached the API as %q, answered correlation id %q", f.mints[0], cid)
	}
	st, body, _ = mint("a2", url.Values{"csrf": {csrf}}, "cid_ui_fedcba9876543210")
	var env struct {
		Error struct{ Code, Message, CorrelationID string } `json:"error"`
	}
	if st != 409 || json.Unmarshal([]byte(body), &env) != nil || env.Error.Code != "allocation_not_active" {
		t.Errorf("mint for an inactive allocation: %d %s", st, body)
	}

	st, body = get(t, c, ts.URL+"/ui/sessions/ts_ok/replay")
	if st != 200 || !strings.Contains(body, `src="/ui/replay.js"`) || !strings.Contains(body, `data-recording-url="/ui/sessions/ts_ok/recording"`) {
		t.Errorf("replay page: %d %s", st, body)
	}
	if st, body = get(t, c, ts.URL+"/ui/sessions/ts_ok/recording"); st != 200 || !strings.Contains(body, `"version":2`) {
		t.Errorf("recording: %d %s", st, body)
	}
}

func TestViewerHasNoTerminal(t *testing.T) {
	ts, f := newAllocServer(t)
	c, csrf := login(t, ts, "view")
	for _, p := range []string{"/ui/allocations", "/ui/allocations/a1"} {
		st, body := get(t, c, ts.URL+p)
		if st != 200 || strings.Contains(body, "Open terminal") || strings.Contains(body, "/terminal\"") ||
			strings.Contains(body, "/replay\"") {
			t.Errorf("viewer %s: %d, has terminal or replay controls: %s", p, st, body)
		}
	}
	if st, _ := get(t, c, ts.URL+"/ui/allocations/a1/terminal"); st != http.StatusForbidden {
		t.Errorf("viewer terminal page: %d, want 403", st)
	}
	if st := post(t, c, ts.URL+"/ui/allocations/a1/terminal-token", url.Values{"csrf": {csrf}}); st != http.StatusForbidden {
		t.Errorf("viewer's forged mint: %d, want 403", st)
	}
	if len(f.mints) != 0 {
		t.Errorf("a viewer's mint reached the API: %v", f.mints)
	}
	if st, _ := get(t, c, ts.URL+"/ui/sessions/ts_ok/recording"); st != http.StatusForbidden {
		t.Errorf("viewer recording: %d, want 403", st)
	}
}
