package preflight

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// fakeAPI is the operator API and terminal gateway as preflight sees them;
// each field is one answer a test may change.
type fakeAPI struct {
	t         *testing.T
	alloc     api.Allocation
	host      api.Host
	taskEnd   api.TaskState // the state GET /api/v1/tasks/{id} answers
	result    *api.TaskResult
	mintCode  int // non-zero: the mint fails with this status
	allocCode int // non-zero: GET of the allocation fails with this status
	healthz   int
	// ws: "refuse" (token_invalid + 4401), "http" (502, no upgrade),
	// "hang" (accept, say nothing), "ready", or an error code to send.
	ws        string
	session   api.TerminalSession
	storeCode int               // answer to POST /api/v1/preflight-runs
	instances map[string]string // instance id → host id

	mu      sync.Mutex
	cids    map[string]bool // X-Correlation-ID values seen
	stored  *preflight.Report
	paths   []string
	offered []string // subprotocols offered on the terminal WebSocket
}

func newFake(t *testing.T) *fakeAPI {
	now := time.Now().UTC()
	return &fakeAPI{t: t,
		alloc:   api.Allocation{ID: "alc_1", Kind: api.AllocationHost, HostID: "node-1", State: api.AllocationActive},
		host:    api.Host{ID: "node-1", Status: api.HostHealthy, LastSeenAt: &now, Enrolled: true},
		taskEnd: api.TaskSucceeded, healthz: http.StatusOK, ws: "refuse", storeCode: http.StatusCreated,
		session: api.TerminalSession{ID: "ses_1", TaskID: "tsk_open", States: []api.TerminalStateEvent{
			{State: "token_ready"}, {State: "browser_ws_ready"}, {State: "terminal_open_sent"},
			{State: "node_stream_connected"}, {State: "pty_ready"}}},
		cids: map[string]bool{}}
}

func (f *fakeAPI) start() *httptest.Server {
	mux := http.NewServeMux()
	js := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /api/v1/allocations/{id}", func(w http.ResponseWriter, r *http.Request) {
		if f.allocCode != 0 {
			js(w, f.allocCode, api.ErrorBody{Error: api.ErrorDetail{Code: "internal", Message: "internal error", CorrelationID: r.Header.Get("X-Correlation-ID")}})
			return
		}
		if r.PathValue("id") != f.alloc.ID {
			js(w, 404, api.ErrorBody{Error: api.ErrorDetail{Code: "not_found", Message: "no such allocation"}})
			return
		}
		js(w, 200, f.alloc)
	})
	mux.HandleFunc("GET /api/v1/instances/{id}", func(w http.ResponseWriter, r *http.Request) {
		host, ok := f.instances[r.PathValue("id")]
		if !ok {
			js(w, 404, api.ErrorBody{Error: api.ErrorDetail{Code: "not_found", Message: "no such instance"}})
			return
		}
		js(w, 200, api.Instance{ID: r.PathValue("id"), HostID: host})
	})
	mux.HandleFunc("GET /api/v1/hosts/{id}", func(w http.ResponseWriter, r *http.Request) { js(w, 200, f.host) })
	mux.HandleFunc("POST /api/v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		var req api.EnqueueTaskRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Type != "diag.health_probe" || req.NodeID != f.host.ID {
			f.t.Errorf("enqueue %+v", req)
		}
		js(w, 201, api.Task{ID: "tsk_probe", NodeID: req.NodeID, Type: req.Type, State: api.TaskQueued, CorrelationID: req.CorrelationID})
	})
	mux.HandleFunc("GET /api/v1/tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		st := f.taskEnd
		if r.PathValue("id") == "tsk_open" {
			st = api.TaskSucceeded
		}
		if !st.Terminal() {
			if d, err := time.ParseDuration(r.URL.Query().Get("wait")); err == nil {
				time.Sleep(min(d, 2*time.Second))
			}
		}
		js(w, 200, api.Task{ID: r.PathValue("id"), State: st, Result: f.result})
	})
	mux.HandleFunc("POST /api/v1/tasks/{id}/cancel", func(w http.ResponseWriter, r *http.Request) { js(w, 200, api.Task{}) })
	mux.HandleFunc("POST /api/v1/allocations/{id}/terminal-token", func(w http.ResponseWriter, r *http.Request) {
		if f.mintCode != 0 {
			w.Header().Set(api.HeaderCorrelationID, "cid-mint")
			js(w, f.mintCode, api.ErrorBody{Error: api.ErrorDetail{Code: "allocation_inactive", Message: "not active", CorrelationID: "cid-mint"}})
			return
		}
		js(w, 201, api.TerminalToken{Token: "tok123", SessionID: "ses_1", AllocationID: f.alloc.ID, NodeID: f.host.ID,
			ExpiresAt: time.Now().Add(time.Minute)})
	})
	mux.HandleFunc("GET /api/v1/terminal-sessions/{sid}", func(w http.ResponseWriter, r *http.Request) { js(w, 200, f.session) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(f.healthz) })
	mux.HandleFunc("POST /api/v1/preflight-runs", func(w http.ResponseWriter, r *http.Request) {
		var rep preflight.Report
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
			f.t.Errorf("stored report: %v", err)
		}
		f.mu.Lock()
		f.stored = &rep
		f.mu.Unlock()
		w.WriteHeader(f.storeCode)
	})
	mux.HandleFunc("GET /api/v1/terminal", f.terminal)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.cids[r.Header.Get(api.HeaderCorrelationID)] = true
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	f.t.Cleanup(srv.Close)
	return srv
}

func (f *fakeAPI) terminal(w http.ResponseWriter, r *http.Request) {
	token := ""
	f.mu.Lock()
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			f.offered = append(f.offered, p)
			if strings.HasPrefix(p, terminal.TokenSubprotocolPrefix) {
				token = strings.TrimPrefix(p, terminal.TokenSubprotocolPrefix)
			}
		}
	}
	f.mu.Unlock()
	if f.ws == "http" {
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{terminal.Subprotocol}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	send := func(ctl terminal.Control) {
		b, _ := terminal.EncodeControl(ctl)
		_ = c.Write(ctx, websocket.MessageBinary, terminal.Encode(terminal.ChanControl, b))
	}
	switch {
	case f.ws == "hang":
		_, _, _ = c.Read(ctx)
	case f.ws == "refuse" || token == invalidToken:
		send(terminal.Error(terminal.CodeTokenInvalid, "the terminal token is not known"))
		_ = c.Close(websocket.StatusCode(terminal.CloseCode(terminal.CodeTokenInvalid)), string(terminal.CodeTokenInvalid))
	case f.ws == "ready":
		send(terminal.Status(terminal.ProgressQueued))
		send(terminal.Status(terminal.ProgressNodeConnecting))
		send(terminal.Ready("ses_1"))
		_, _, _ = c.Read(ctx)
	default:
		code := terminal.ErrorCode(f.ws)
		send(terminal.Status(terminal.ProgressQueued))
		send(terminal.Error(code, "scripted failure"))
		_ = c.Close(websocket.StatusCode(terminal.CloseCode(code)), string(code))
	}
}

// fakeAgent writes a drover-agent stand-in printing the node report with
// the given hop results (exit 1 when one failed); its arguments land in
// args.txt beside it.
func fakeAgent(t *testing.T, hops ...preflight.HopResult) string {
	t.Helper()
	dir := t.TempDir()
	failed := false
	for _, h := range hops {
		failed = failed || h.Status == preflight.Failed
	}
	b, _ := json.Marshal(preflight.NodeReport{Schema: preflight.SchemaVersion, NodeID: "node-1", AgentVersion: "test",
		GOOS: "linux", GOARCH: "amd64", Hops: hops})
	code := 0
	if failed {
		code = 1
	}
	script := "#!/bin/sh\necho \"$@\" > " + filepath.Join(dir, "args.txt") + "\ncat <<'EOF'\n" + string(b) + "\nEOF\nexit " +
		map[bool]string{true: "1", false: "0"}[code == 1] + "\n"
	p := filepath.Join(dir, "drover-agent")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// nodeHops are a healthy node's results; fail replaces one hop's.
func nodeHops(fail signal.Hop, n signal.Name) []preflight.HopResult {
	var out []preflight.HopResult
	for _, h := range []signal.Hop{signal.HopNodeReadiness, signal.HopNodeRuntimeAPIReachability, signal.HopNodeTerminalReachability} {
		r := preflight.HopResult{Hop: h, Status: preflight.Passed, DurationMS: 3, Detail: "ok"}
		if h == fail {
			r.Fail(n, "scripted")
		}
		out = append(out, r)
	}
	return out
}
