package nodeapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// seen is one request as the test server got it.
type seen struct {
	method, uri, cid, ctype, body string
}

// recorder serves answer for every route and records the requests.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
}

func (rec *recorder) last(t *testing.T) seen {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.reqs) == 0 {
		t.Fatal("no request reached the server")
	}
	return rec.reqs[len(rec.reqs)-1]
}

func newServer(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) (*Client, *recorder) {
	t.Helper()
	rec := &recorder{}
	mux := http.NewServeMux()
	for _, rt := range Routes() {
		mux.HandleFunc(rt.MuxPattern(), func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			rec.mu.Lock()
			rec.reqs = append(rec.reqs, seen{r.Method, r.URL.RequestURI(), r.Header.Get(api.HeaderCorrelationID),
				r.Header.Get("Content-Type"), string(b)})
			rec.mu.Unlock()
			answer(w, r)
		})
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.Client(), srv.URL+"/ignored/base/path")
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// TestClientRequests: each method sends its route's method and path, a JSON
// body with Content-Type only when it has one, the correlation id where
// given, and decodes the answer.
func TestClientRequests(t *testing.T) {
	c, rec := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/tasks/wait") && r.URL.Query().Get("max") == "3":
			writeJSON(w, http.StatusOK, api.TaskDelivery{TaskID: "t-1", More: []api.TaskDelivery{{TaskID: "t-2"}, {TaskID: "t-3"}}})
		case strings.HasSuffix(r.URL.Path, "/tasks/wait"):
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/heartbeat"):
			writeJSON(w, http.StatusOK, api.HeartbeatResponse{HeartbeatInterval: api.Duration(7 * time.Second)})
		case strings.HasSuffix(r.URL.Path, "/tasks/results"):
			writeJSON(w, http.StatusOK, ResultsAck{Results: []ResultItemAck{{TaskID: "t-1", Status: 200, State: api.TaskSucceeded},
				{TaskID: "t-2", Status: 404, Error: &api.ErrorDetail{Code: "task_not_found"}}}})
		case strings.HasSuffix(r.URL.Path, "/result"):
			writeJSON(w, http.StatusOK, ResultAck{TaskID: r.PathValue("task_id"), State: api.TaskSucceeded})
		case strings.HasSuffix(r.URL.Path, "/instances"):
			writeJSON(w, http.StatusOK, api.NodeInstances{ETag: "e2"})
		case strings.HasSuffix(r.URL.Path, "/jwks"):
			writeJSON(w, http.StatusOK, api.JWKS{Keys: []api.JWK{{Kid: "k1"}}})
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	ctx := t.Context()

	hb, err := c.Heartbeat(ctx, "n1", api.Heartbeat{AgentVersion: "v"})
	if err != nil || hb.HeartbeatInterval != api.Duration(7*time.Second) {
		t.Fatalf("Heartbeat: %+v %v", hb, err)
	}
	if s := rec.last(t); s.method != "POST" || s.uri != "/internal/v1/nodes/n1/heartbeat" ||
		s.ctype != "application/json" || s.body != `{"agent_version":"v"}` || s.cid != "" {
		t.Errorf("heartbeat request %+v", s)
	}

	if ds, err := c.WaitTasks(ctx, "n1", 25*time.Second, 1); err != nil || ds != nil {
		t.Fatalf("WaitTasks on 204: %+v %v", ds, err)
	}
	if s := rec.last(t); s.method != "GET" || s.uri != "/internal/v1/nodes/n1/tasks/wait?timeout=25s&max=1" || s.ctype != "" || s.body != "" {
		t.Errorf("wait request %+v", s)
	}

	ds, err := c.WaitTasks(ctx, "n1", 25*time.Second, 3)
	if err != nil || len(ds) != 3 || ds[0].TaskID != "t-1" || ds[0].More != nil || ds[1].TaskID != "t-2" || ds[2].TaskID != "t-3" {
		t.Fatalf("WaitTasks: %+v %v", ds, err)
	}
	if s := rec.last(t); s.method != "GET" || s.uri != "/internal/v1/nodes/n1/tasks/wait?timeout=25s&max=3" {
		t.Errorf("wait request %+v", s)
	}

	ack, err := c.PostResult(ctx, "n1", "t-1", "cid-1", api.TaskResult{Status: api.ResultSucceeded})
	if err != nil || ack.TaskID != "t-1" || ack.State != api.TaskSucceeded {
		t.Fatalf("PostResult: %+v %v", ack, err)
	}
	if s := rec.last(t); s.uri != "/internal/v1/nodes/n1/tasks/t-1/result" || s.cid != "cid-1" {
		t.Errorf("result request %+v", s)
	}

	acks, err := c.PostResults(ctx, "n1", []api.TaskResultFor{{TaskID: "t-1", Result: api.TaskResult{Status: api.ResultSucceeded}},
		{TaskID: "t-2", Result: api.TaskResult{Status: api.ResultSucceeded}}})
	if err != nil || len(acks.Results) != 2 || acks.Results[0].State != api.TaskSucceeded || acks.Results[1].Error.Code != "task_not_found" {
		t.Fatalf("PostResults: %+v %v", acks, err)
	}
	if s := rec.last(t); s.method != "POST" || s.uri != "/internal/v1/nodes/n1/tasks/results" || s.ctype != "application/json" ||
		s.body != `{"results":[{"task_id":"t-1","result":{"status":"succeeded","finished_at":"0001-01-01T00:00:00Z"}},{"task_id":"t-2","result":{"status":"succeeded","finished_at":"0001-01-01T00:00:00Z"}}]}` {
		t.Errorf("results request %+v", s)
	}

	if err := c.PostEvent(ctx, "n1", "t-1", "cid-2", api.TaskEvent{Phase: "started"}); err != nil {
		t.Fatal(err)
	}
	if s := rec.last(t); s.uri != "/internal/v1/nodes/n1/tasks/t-1/events" || s.cid != "cid-2" {
		t.Errorf("event request %+v", s)
	}

	set, err := c.DesiredInstances(ctx, "n1", 30*time.Second, "a b&c")
	if err != nil || set.ETag != "e2" {
		t.Fatalf("DesiredInstances: %+v %v", set, err)
	}
	if s := rec.last(t); s.uri != "/internal/v1/nodes/n1/instances?wait=30s&etag=a+b%26c" {
		t.Errorf("instances request %+v", s)
	}

	if err := c.PutCapabilities(ctx, "n1", api.Capabilities{Hostname: "h"}); err != nil {
		t.Fatal(err)
	}
	if s := rec.last(t); s.method != "PUT" || s.uri != "/internal/v1/nodes/n1/capabilities" {
		t.Errorf("capabilities request %+v", s)
	}
	if jwks, err := c.JWKS(ctx, "n1"); err != nil || len(jwks.Keys) != 1 {
		t.Fatalf("JWKS: %+v %v", jwks, err)
	}
	if _, err := c.InstanceStatus(ctx, "n1", "i/1", api.InstanceStatusReport{}); err != nil {
		t.Fatal(err)
	}
	if s := rec.last(t); s.uri != "/internal/v1/nodes/n1/instances/i%2F1/status" {
		t.Errorf("status request %+v", s)
	}
}

// TestClientErrors: a non-2xx answer is an *Error with the envelope's code
// and message, the whole body and a positive Retry-After; a 2xx answer that
// does not decode names the request.
func TestClientErrors(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/heartbeat"):
			w.Header().Set("Retry-After", "3")
			writeJSON(w, http.StatusTooManyRequests, api.ErrorBody{Error: api.ErrorDetail{Code: "rate_limited", Message: "slow down"}})
		case strings.HasSuffix(r.URL.Path, "/renew"):
			w.Header().Set("Retry-After", "0")
			http.Error(w, "plain failure", http.StatusBadGateway)
		case strings.HasSuffix(r.URL.Path, "/tasks/wait"):
			writeJSON(w, http.StatusOK, "not a delivery")
		default:
			writeJSON(w, http.StatusForbidden, api.ErrorBody{Error: api.ErrorDetail{Code: "node_mismatch", Message: "no"}})
		}
	})
	ctx := t.Context()
	_, err := c.Heartbeat(ctx, "n1", api.Heartbeat{})
	var e *Error
	if !errors.As(err, &e) || e.Status != 429 || e.Code != "rate_limited" || e.Message != "slow down" ||
		e.RetryAfter != 3*time.Second || !e.Retryable() || !IsStatus(err, 429) {
		t.Fatalf("heartbeat error %#v", err)
	}
	if got := err.Error(); got != "control plane answered 429 rate_limited: slow down" {
		t.Errorf("Error() = %q", got)
	}
	_, err = c.Renew(ctx, "n1", api.RenewRequest{})
	if !errors.As(err, &e) || e.Status != 502 || e.Code != "" || e.RetryAfter != 0 || !strings.Contains(e.Body, "plain failure") {
		t.Fatalf("renew error %#v", err)
	}
	if got := err.Error(); got != "control plane answered 502: plain failure\n" {
		t.Errorf("Error() = %q", got)
	}
	_, err = c.JWKS(ctx, "n1")
	if !errors.As(err, &e) || e.Retryable() || !IsStatus(err, http.StatusForbidden) {
		t.Fatalf("jwks error %#v", err)
	}
	_, err = c.WaitTasks(ctx, "n1", time.Second, 1)
	if err == nil || errors.As(err, &e) || !strings.Contains(err.Error(), "decode GET /internal/v1/nodes/n1/tasks/wait?timeout=1s&max=1 response") {
		t.Fatalf("undecodable delivery: %v", err)
	}
	var ue *url.Error
	dead, _ := NewClient(http.DefaultClient, "http://127.0.0.1:1")
	if _, err := dead.Register(ctx, api.RegisterRequest{}); !errors.As(err, &ue) {
		t.Fatalf("unreachable: %T %v", err, err)
	}
}

// TestTerminalURL keeps the base URL's path and drops its trailing slash.
func TestTerminalURL(t *testing.T) {
	for base, want := range map[string]string{
		"https://gw:8443":       "https://gw:8443/internal/v1/nodes/n%2F1/terminal/s1",
		"wss://gw/prefix/":      "wss://gw/prefix/internal/v1/nodes/n%2F1/terminal/s1",
		"https://gw:8443/a/b//": "https://gw:8443/a/b/internal/v1/nodes/n%2F1/terminal/s1",
	} {
		u, _ := url.Parse(base)
		if got := TerminalURL(u, "n/1", "s1"); got != want {
			t.Errorf("TerminalURL(%s) = %s, want %s", base, got, want)
		}
	}
}

// TestHeartbeatMinimal: Heartbeat asks for the minimal answer and reads
// the interval from its header; a JSON answer (a control plane that does
// not honour Prefer) still works, and a malformed header is an error.
func TestHeartbeatMinimal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		want   time.Duration
		err    string
	}{
		{"minimal", func(w http.ResponseWriter) {
			w.Header().Set(api.HeaderHeartbeatInterval, "7s")
			w.WriteHeader(http.StatusNoContent)
		}, 7 * time.Second, ""},
		{"json", func(w http.ResponseWriter) {
			writeJSON(w, http.StatusOK, api.HeartbeatResponse{HeartbeatInterval: api.Duration(3 * time.Second)})
		}, 3 * time.Second, ""},
		{"204 without interval", func(w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) }, 0, ""},
		{"bad interval", func(w http.ResponseWriter) {
			w.Header().Set(api.HeaderHeartbeatInterval, "soon")
			w.WriteHeader(http.StatusNoContent)
		}, 0, `Drover-Heartbeat-Interval "soon"`},
		{"negative interval", func(w http.ResponseWriter) {
			w.Header().Set(api.HeaderHeartbeatInterval, "-1s")
			w.WriteHeader(http.StatusNoContent)
		}, 0, "not a positive duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var prefer string
			c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				prefer = r.Header.Get(api.HeaderPrefer)
				tc.answer(w)
			})
			hb, err := c.Heartbeat(t.Context(), "n1", api.Heartbeat{AgentVersion: "v"})
			if prefer != api.PreferMinimal {
				t.Fatalf("Prefer %q, want %q", prefer, api.PreferMinimal)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || time.Duration(hb.HeartbeatInterval) != tc.want {
				t.Fatalf("Heartbeat: %+v %v, want interval %s", hb, err, tc.want)
			}
		})
	}
}

// TestHeartbeatConditional: a heartbeat identical to the last accepted one
// goes without its body, as If-Match with the ETag it was answered; a
// changed one, one after an error (of the heartbeat, or of any request
// that did not reach the control plane), and one to a control plane that
// sends no ETag carry the body; a 412 or 422 to a body-less one is
// followed at once by the body.
func TestHeartbeatConditional(t *testing.T) {
	type sent struct{ body, ifMatch string }
	var (
		mu      sync.Mutex
		got     []sent
		held    string // the body the fake control plane holds
		etags   = true
		refuse  = 0 // answer body-less heartbeats with this status
		failAll = false
	)
	var rec *recorder
	c, rec := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b := []byte(rec.last(t).body) // the recorder read the body
		mu.Lock()
		defer mu.Unlock()
		got = append(got, sent{string(b), r.Header.Get("If-Match")})
		switch {
		case failAll:
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case len(b) > 0:
			held = string(b)
		case refuse != 0:
			w.WriteHeader(refuse)
			return
		case r.Header.Get("If-Match") != `"`+held+`"`:
			w.WriteHeader(http.StatusPreconditionFailed)
			return
		}
		if etags {
			w.Header().Set("ETag", `"`+held+`"`)
		}
		w.Header().Set(api.HeaderHeartbeatInterval, "5s")
		w.WriteHeader(http.StatusNoContent)
	})
	// beat sends hb and returns what reached the server for it.
	beat := func(hb api.Heartbeat) []sent {
		t.Helper()
		mu.Lock()
		got = nil
		mu.Unlock()
		_, err := c.Heartbeat(t.Context(), "n1", hb)
		mu.Lock()
		defer mu.Unlock()
		if err != nil && !failAll {
			t.Fatalf("Heartbeat: %v", err)
		}
		return got
	}
	a, b := api.Heartbeat{AgentVersion: "a"}, api.Heartbeat{AgentVersion: "b"}
	full := func(hb api.Heartbeat) sent { return sent{string(mustMarshal(t, hb)), ""} }
	tagged := func(hb api.Heartbeat) sent { return sent{"", `"` + string(mustMarshal(t, hb)) + `"`} }
	for i, step := range []struct {
		name  string
		setup func()
		hb    api.Heartbeat
		want  []sent
	}{
		{"first", nil, a, []sent{full(a)}},
		{"unchanged", nil, a, []sent{tagged(a)}},
		{"unchanged again", nil, a, []sent{tagged(a)}},
		{"changed", nil, b, []sent{full(b)}},
		{"replica without it", func() { held = "other" }, b, []sent{tagged(b), full(b)}},
		{"after it", nil, b, []sent{tagged(b)}},
		{"replica before If-Match", func() { refuse = http.StatusUnprocessableEntity }, b, []sent{tagged(b), full(b)}},
		{"server error", func() { refuse, failAll = 0, true }, b, []sent{tagged(b)}},
		{"after the error", func() { failAll = false }, b, []sent{full(b)}},
		{"no ETag", func() { etags, refuse = false, http.StatusUnprocessableEntity }, b, []sent{tagged(b), full(b)}},
		{"still no ETag", nil, b, []sent{full(b)}},
		{"ETag again", func() { etags, refuse = true, 0 }, b, []sent{full(b)}},
		{"after it, again", nil, b, []sent{tagged(b)}},
	} {
		if step.setup != nil {
			mu.Lock()
			step.setup()
			mu.Unlock()
		}
		if g := beat(step.hb); !slices.Equal(g, step.want) {
			t.Fatalf("step %d (%s): sent %+v, want %+v", i, step.name, g, step.want)
		}
	}

	// Any request that fails to reach the control plane (here: cancelled)
	// makes the next heartbeat carry its body: it may have restarted.
	if g := beat(b); !slices.Equal(g, []sent{tagged(b)}) {
		t.Fatalf("before the failed request: sent %+v", g)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := c.JWKS(ctx, "n1"); err == nil {
		t.Fatal("JWKS with a cancelled context succeeded")
	}
	if g := beat(b); !slices.Equal(g, []sent{full(b)}) {
		t.Fatalf("after a failed request: sent %+v, want the body", g)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
