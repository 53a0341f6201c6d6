package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestTaskListFiltersAndEnvelope: GET /api/v1/tasks filters by node_id,
// type, state and correlation_id; GET /api/v1/tasks/{id} carries the
// envelope metadata.
func TestTaskListFiltersAndEnvelope(t *testing.T) {
	e := newRoleEnv(t)
	op, viewer := e.tokens[api.RoleOperator].Token, e.tokens[api.RoleViewer].Token
	for _, h := range []string{"n1", "n2"} {
		if st, _, body := e.do(t, http.MethodPost, "/api/v1/hosts", op, `{"host_id":"`+h+`","os_family":"linux"}`); st != http.StatusCreated {
			t.Fatalf("create host: %d %s", st, body)
		}
	}
	ids := map[string]string{}
	for _, c := range []struct{ name, node, typ string }{{"a", "n1", "diag.health_probe"}, {"b", "n1", "diag.echo"},
		{"c", "n2", "diag.health_probe"}} {
		st, _, body := e.do(t, http.MethodPost, "/api/v1/tasks", op,
			`{"node_id":"`+c.node+`","type":"`+c.typ+`","correlation_id":"cid-`+c.name+`"}`)
		var tk api.Task
		if err := json.Unmarshal(body, &tk); st != http.StatusCreated || err != nil {
			t.Fatalf("enqueue %s: %d %s", c.name, st, body)
		}
		ids[tk.ID] = c.name
		e.clock.advance(time.Millisecond)
	}
	list := func(q string) []string {
		t.Helper()
		st, _, body := e.do(t, http.MethodGet, "/api/v1/tasks?"+q, viewer, "")
		var ts []api.Task
		if err := json.Unmarshal(body, &ts); st != http.StatusOK || err != nil {
			t.Fatalf("list %s: %d %s", q, st, body)
		}
		var out []string
		for _, tk := range ts {
			out = append(out, ids[tk.ID])
		}
		return out
	}
	for q, want := range map[string]string{
		"":                                  "c b a",
		"type=diag.health_probe":            "c a",
		"node_id=n1&type=diag.health_probe": "a",
		"state=queued&type=diag.echo":       "b",
		"state=succeeded":                   "",
		"correlation_id=cid-c":              "c",
	} {
		got := ""
		for i, n := range list(q) {
			if i > 0 {
				got += " "
			}
			got += n
		}
		if got != want {
			t.Errorf("tasks?%s: %q, want %q", q, got, want)
		}
	}
	for id, name := range ids {
		if name != "a" {
			continue
		}
		st, _, body := e.do(t, http.MethodGet, "/api/v1/tasks/"+id, viewer, "")
		var tk api.Task
		if err := json.Unmarshal(body, &tk); st != http.StatusOK || err != nil {
			t.Fatalf("show: %d %s", st, body)
		}
		env := tk.Envelope
		if env == nil || env.KID == "" || env.Audience != "n1" || env.Expires != tk.ExpiresAt.Unix() || env.IssuedAt != 0 {
			t.Errorf("envelope %+v (task expires %v)", env, tk.ExpiresAt)
		}
	}
}

// TestAuditFiltersAndExport: GET /api/v1/audit filters by actor, role,
// action, target, since and until, refuses bad ones, and exports JSON
// lines with ?format=jsonl.
func TestAuditFiltersAndExport(t *testing.T) {
	e := newRoleEnv(t)
	op, viewer := e.tokens[api.RoleOperator].Token, e.tokens[api.RoleViewer].Token
	start := e.clock.Now()
	e.clock.advance(time.Second)
	for _, h := range []string{"w1", "w2"} {
		if st, _, body := e.do(t, http.MethodPost, "/api/v1/hosts", op, `{"host_id":"`+h+`","os_family":"linux"}`); st != http.StatusCreated {
			t.Fatalf("create host: %d %s", st, body)
		}
		e.clock.advance(time.Second)
	}
	list := func(q url.Values) (int, []api.AuditEvent) {
		t.Helper()
		st, _, body := e.do(t, http.MethodGet, "/api/v1/audit?"+q.Encode(), viewer, "")
		var out []api.AuditEvent
		if st == http.StatusOK {
			if err := json.Unmarshal(body, &out); err != nil {
				t.Fatal(err)
			}
		}
		return st, out
	}
	targets := func(evs []api.AuditEvent) string {
		s := ""
		for _, ev := range evs {
			s += ev.Target + ";"
		}
		return s
	}
	ts := func(d time.Duration) string { return start.Add(d).Format(time.RFC3339Nano) }
	for _, c := range []struct {
		q    url.Values
		want string
	}{
		{url.Values{"actor": {"operator:tok-operator"}, "action": {"host.create"}}, "w2;w1;"},
		{url.Values{"role": {"operator"}, "target": {"w1"}, "action": {"host.create"}}, "w1;"},
		{url.Values{"role": {"viewer"}, "target": {"w1"}}, ""},
		{url.Values{"role": {"admin"}, "action": {"host.create"}}, ""},
		{url.Values{"action": {"host.create"}, "since": {ts(1500 * time.Millisecond)}}, "w2;"},
		{url.Values{"action": {"host.create"}, "until": {ts(1500 * time.Millisecond)}}, "w1;"},
		{url.Values{"action": {"host.create"}, "since": {ts(0)}, "until": {ts(time.Hour)}}, "w2;w1;"},
	} {
		st, evs := list(c.q)
		if got := targets(evs); st != http.StatusOK || got != c.want {
			t.Errorf("audit?%s: %d %q, want %q", c.q.Encode(), st, got, c.want)
		}
	}
	for _, q := range []url.Values{{"since": {"yesterday"}}, {"until": {"1"}}, {"role": {"root"}}, {"format": {"csv"}}} {
		if st, _ := list(q); st != http.StatusUnprocessableEntity {
			t.Errorf("audit?%s: %d, want 422", q.Encode(), st)
		}
	}

	r := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/api/v1/audit?format=jsonl&action=host.create", nil)
	r.Header.Set("Authorization", "Bearer "+viewer)
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("export: %d %q", w.Code, w.Header().Get("Content-Type"))
	}
	var got []string
	sc := bufio.NewScanner(bytes.NewReader(w.Body.Bytes()))
	for sc.Scan() {
		var ev api.AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("export line %q: %v", sc.Text(), err)
		}
		got = append(got, ev.Target)
	}
	if len(got) != 2 || got[0] != "w2" || got[1] != "w1" {
		t.Errorf("export targets %v", got)
	}
}
