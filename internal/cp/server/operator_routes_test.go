package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
)

// wantRoles is the reviewed minimum role of every operator route. It must
// list exactly the routes of operatorRoutes: a route added there without an
// entry here (or with another role) fails TestOperatorRouteRoles.
var wantRoles = map[string]api.Role{
	"GET /api/v1/hosts":                             api.RoleViewer,
	"POST /api/v1/hosts":                            api.RoleOperator,
	"GET /api/v1/hosts/{id}":                        api.RoleViewer,
	"POST /api/v1/hosts/{id}/enable":                api.RoleOperator,
	"POST /api/v1/hosts/{id}/disable":               api.RoleOperator,
	"POST /api/v1/hosts/{id}/rotate-token":          api.RoleOperator,
	"POST /api/v1/hosts/{id}/revoke":                api.RoleAdmin,
	"GET /api/v1/hosts/{id}/slots":                  api.RoleViewer,
	"POST /api/v1/hosts/{id}/slots":                 api.RoleOperator,
	"DELETE /api/v1/hosts/{id}/slots/{slot_id}":     api.RoleOperator,
	"POST /api/v1/hosts/{id}/drain":                 api.RoleOperator,
	"POST /api/v1/hosts/{id}/undrain":               api.RoleOperator,
	"POST /api/v1/hosts/{id}/profile":               api.RoleOperator,
	"GET /api/v1/preflight-runs":                    api.RoleViewer,
	"POST /api/v1/preflight-runs":                   api.RoleOperator,
	"GET /api/v1/preflight-runs/{id}":               api.RoleViewer,
	"GET /api/v1/evidence/{correlation_id}":         api.RoleOperator,
	"POST /api/v1/placements/check":                 api.RoleOperator,
	"GET /api/v1/instances":                         api.RoleViewer,
	"POST /api/v1/instances":                        api.RoleOperator,
	"GET /api/v1/instances/{id}":                    api.RoleViewer,
	"GET /api/v1/instances/{id}/events":             api.RoleViewer,
	"GET /api/v1/instances/{id}/logs":               api.RoleViewer,
	"POST /api/v1/instances/{id}/stop":              api.RoleOperator,
	"POST /api/v1/instances/{id}/start":             api.RoleOperator,
	"DELETE /api/v1/instances/{id}":                 api.RoleOperator,
	"POST /api/v1/instance-groups/{group}/scale":    api.RoleOperator,
	"GET /api/v1/allocations":                       api.RoleViewer,
	"POST /api/v1/allocations":                      api.RoleOperator,
	"GET /api/v1/allocations/{id}":                  api.RoleViewer,
	"DELETE /api/v1/allocations/{id}":               api.RoleOperator,
	"POST /api/v1/allocations/{id}/terminal-token":  api.RoleOperator,
	"GET /api/v1/allocations/{id}/sessions":         api.RoleViewer,
	"GET /api/v1/terminal-sessions/{sid}":           api.RoleViewer,
	"GET /api/v1/terminal-sessions/{sid}/recording": api.RoleOperator,
	"GET /api/v1/tasks":                             api.RoleViewer,
	"POST /api/v1/tasks":                            api.RoleOperator,
	"POST /api/v1/tasks:batch":                      api.RoleOperator,
	"GET /api/v1/tasks/{id}":                        api.RoleViewer,
	"POST /api/v1/tasks/{id}/cancel":                api.RoleOperator,
	"GET /api/v1/task-types":                        api.RoleViewer,
	"GET /api/v1/tokens":                            api.RoleAdmin,
	"POST /api/v1/tokens":                           api.RoleAdmin,
	"POST /api/v1/tokens/{id}/revoke":               api.RoleAdmin,
	"GET /api/v1/secrets":                           api.RoleViewer,
	"GET /api/v1/secrets/{name}":                    api.RoleViewer,
	"PUT /api/v1/secrets/{name}":                    api.RoleOperator,
	"DELETE /api/v1/secrets/{name}":                 api.RoleOperator,
	"GET /api/v1/audit":                             api.RoleViewer,
	"POST /api/v1/signing-keys/rotate":              api.RoleAdmin,
	"GET /api/v1/ca":                                api.RoleViewer,
}

// wantPublic are the only routes served without an operator token. The
// dashboard's (/ui/login onwards) take its session cookie instead and call
// the operator routes in-process with the session's token
// (internal/cp/dashboard tests their CSRF and role refusals).
var wantPublic = []string{"GET /healthz", "GET /readyz", "GET /metrics", "GET /api/v1/terminal", "GET /ui/", "GET /{$}",
	"GET /ui/login", "POST /ui/login", "POST /ui/logout", "GET /ui/fleet", "GET /ui/fleet/events", "GET /ui/hosts/{id}",
	"GET /ui/hosts/{id}/live", "POST /ui/hosts/{id}/actions/{action}",
	"GET /ui/evidence/{cid}", "GET /ui/tasks", "GET /ui/tasks/{id}", "GET /ui/audit", "GET /ui/audit/export",
	"GET /ui/instances", "GET /ui/instances/{id}", "GET /ui/instances/{id}/logs", "POST /ui/instances/{id}/actions/{action}",
	"GET /ui/allocations", "GET /ui/allocations/{id}", "GET /ui/allocations/{id}/terminal", "POST /ui/allocations/{id}/terminal-token",
	"GET /ui/sessions/{sid}/replay", "GET /ui/sessions/{sid}/recording"}

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// roleEnv is a server on SQLite with one operator token per role.
type roleEnv struct {
	s      *Server
	st     store.Store
	h      http.Handler
	clock  *clock
	tokens map[api.Role]api.OperatorToken
}

func newRoleEnv(t *testing.T) *roleEnv {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c := &clock{now: time.Now().UTC().Truncate(time.Millisecond)}
	s, err := New(ctx, Config{Now: c.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), InsecurePlaintextKeys: true}, st)
	if err != nil {
		t.Fatal(err)
	}
	e := &roleEnv{s: s, st: st, h: s.OperatorHandler(), clock: c, tokens: map[api.Role]api.OperatorToken{}}
	for _, r := range api.Roles {
		tok, err := s.CreateOperatorToken(ctx, OperatorTokenSpec{Name: "tok-" + string(r), Role: r})
		if err != nil {
			t.Fatal(err)
		}
		e.tokens[r] = tok
	}
	return e
}

// do sends a request with bearer (none if empty) and decodes an error body.
func (e *roleEnv) do(t *testing.T, method, path, bearer, body string) (int, api.ErrorDetail, []byte) {
	t.Helper()
	return testutil.ServeAPI(t, e.h, method, path, bearer, body)
}

var pathParam = regexp.MustCompile(`\{[a-z_]+\}`)

// TestOperatorRouteRoles walks every operator route: without a token it is
// 401; every role below the route's gets 403 operator_role_forbidden
// naming the required role; the required role and those above it are not
// refused (the handler runs, and answers 2xx/4xx on its own terms).
func TestOperatorRouteRoles(t *testing.T) {
	e := newRoleEnv(t)
	routes := e.s.operatorRoutes()
	got := map[string]api.Role{}
	for _, rt := range routes {
		if _, dup := got[rt.key()]; dup {
			t.Errorf("route %s registered twice", rt.key())
		}
		got[rt.key()] = rt.role
	}
	for k, r := range got {
		if want, ok := wantRoles[k]; !ok {
			t.Errorf("route %s (role %s) has no entry in wantRoles", k, r)
		} else if r != want {
			t.Errorf("route %s: role %s, want %s", k, r, want)
		}
	}
	for k := range wantRoles {
		if _, ok := got[k]; !ok {
			t.Errorf("wantRoles lists %s, which is not registered", k)
		}
	}
	var public []string
	for _, p := range e.s.publicRoutes() {
		public = append(public, p.pattern)
	}
	if !slices.Equal(public, wantPublic) {
		t.Errorf("public routes %q, want %q", public, wantPublic)
	}

	for _, rt := range routes {
		t.Run(rt.key(), func(t *testing.T) {
			path := pathParam.ReplaceAllString(rt.pattern, "nope")
			if st, ed, _ := e.do(t, rt.method, path, "", ""); st != http.StatusUnauthorized || ed.Code != "operator_token_required" {
				t.Fatalf("no token: %d %s", st, ed.Code)
			}
			for _, role := range api.Roles {
				st, ed, body := e.do(t, rt.method, path, e.tokens[role].Token, "")
				forbidden := st == http.StatusForbidden || ed.Code == "operator_role_forbidden"
				if role.AtLeast(rt.role) {
					if forbidden {
						t.Errorf("role %s refused: %d %s", role, st, body)
					}
					continue
				}
				if st != http.StatusForbidden || ed.Code != "operator_role_forbidden" ||
					!strings.Contains(ed.Message, "requires role "+string(rt.role)) {
					t.Errorf("role %s: %d %s, want 403 operator_role_forbidden naming %s", role, st, body, rt.role)
				}
			}
		})
	}
}

// TestOperatorRouteWithoutRolePanics: registration refuses a route whose
// role is missing or unknown, and operatorAuth admits no one to one.
func TestOperatorRouteWithoutRolePanics(t *testing.T) {
	e := newRoleEnv(t)
	for _, bad := range []api.Role{"", "root"} {
		h := e.s.operatorAuth(bad, func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusNoContent)
			return nil
		})
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r.Header.Set("Authorization", "Bearer "+e.tokens[api.RoleAdmin].Token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusForbidden {
			t.Errorf("role %q: admin got %d, want 403", bad, w.Code)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("OperatorHandler accepted a route without a role")
		}
	}()
	mux := http.NewServeMux()
	for _, rt := range append(e.s.operatorRoutes(), operatorRoute{method: "GET", pattern: "/api/v1/new"}) {
		registerOperatorRoute(mux, e.s, rt)
	}
}

// TestTokenAuth: revoked and expired tokens are refused whatever their role.
func TestTokenAuth(t *testing.T) {
	e := newRoleEnv(t)
	ctx := t.Context()
	short, err := e.s.CreateOperatorToken(ctx, OperatorTokenSpec{Name: "short", Role: api.RoleAdmin, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.st.RevokeOperatorToken(ctx, e.tokens[api.RoleAdmin].ID); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		advance time.Duration
		bearer  string
		status  int
		code    string
	}{
		{"revoked admin", 0, e.tokens[api.RoleAdmin].Token, http.StatusUnauthorized, "operator_token_invalid"},
		{"unknown token", 0, "drv_op_nope", http.StatusUnauthorized, "operator_token_invalid"},
		{"ttl token before expiry", 0, short.Token, http.StatusOK, ""},
		{"ttl token after expiry", time.Hour, short.Token, http.StatusUnauthorized, "operator_token_invalid"},
		{"viewer unaffected", 0, e.tokens[api.RoleViewer].Token, http.StatusOK, ""},
	}
	for _, tt := range tests {
		e.clock.advance(tt.advance)
		if st, ed, body := e.do(t, http.MethodGet, "/api/v1/hosts", tt.bearer, ""); st != tt.status || ed.Code != tt.code {
			t.Errorf("%s: %d %s, want %d %s", tt.name, st, body, tt.status, tt.code)
		}
	}
}

// TestAuditCarriesTokenAndRole: what a token does is audited as
// operator:<name> with the token's id and role; a refused call is audited
// too; entries by other actors in the same request carry no token.
func TestAuditCarriesTokenAndRole(t *testing.T) {
	e := newRoleEnv(t)
	op, viewer := e.tokens[api.RoleOperator], e.tokens[api.RoleViewer]
	if st, _, body := e.do(t, http.MethodPost, "/api/v1/hosts", op.Token, `{"host_id":"web-1","os_family":"linux"}`); st != http.StatusCreated {
		t.Fatalf("create host: %d %s", st, body)
	}
	if st, _, _ := e.do(t, http.MethodPost, "/api/v1/hosts/web-1/revoke", op.Token, ""); st != http.StatusForbidden {
		t.Fatalf("operator revoking a host: %d, want 403", st)
	}
	ctx := httpapi.WithPrincipal(t.Context(), httpapi.Principal{TokenID: viewer.ID, Name: viewer.Name, Role: api.RoleViewer})
	e.s.audit.Record(ctx, audit.Entry{Actor: "system", Action: "probe.system"})
	e.s.audit.Record(ctx, audit.Entry{Actor: "operator:" + viewer.Name, Action: "probe.viewer"})

	evs, err := e.st.ListAudit(t.Context(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		actor, tokenID string
		role           api.Role
		target, result string
	}
	got := map[string]row{}
	for _, ev := range evs {
		got[ev.Action] = row{ev.Actor, ev.ActorTokenID, ev.ActorRole, ev.Target, ev.Result}
	}
	want := map[string]row{
		"host.create":        {"operator:tok-operator", op.ID, api.RoleOperator, "web-1", "ok"},
		"operator.forbidden": {"operator:tok-operator", op.ID, api.RoleOperator, "POST /api/v1/hosts/{id}/revoke", "forbidden"},
		"probe.system":       {"system", "", "", "", ""},
		"probe.viewer":       {"operator:tok-viewer", viewer.ID, api.RoleViewer, "", ""},
	}
	for action, w := range want {
		if g, ok := got[action]; !ok || g != w {
			t.Errorf("audit %s: %+v, want %+v", action, g, w)
		}
	}
	// The tokens minted at start-up had no principal: "system", no token.
	if g := got["token.create"]; g.actor != "system" || g.tokenID != "" || g.role != "" {
		t.Errorf("offline token.create audited as %+v", g)
	}

	// GET /api/v1/audit shows the same fields.
	st, _, body := e.do(t, http.MethodGet, "/api/v1/audit?target=web-1", e.tokens[api.RoleViewer].Token, "")
	var out []api.AuditEvent
	if err := json.Unmarshal(body, &out); st != http.StatusOK || err != nil {
		t.Fatalf("audit: %d %v %s", st, err, body)
	}
	i := slices.IndexFunc(out, func(ev api.AuditEvent) bool { return ev.Action == "host.create" })
	if i < 0 || out[i].ActorTokenID != op.ID || out[i].ActorRole != api.RoleOperator {
		t.Fatalf("audit API: %+v", out)
	}
}
