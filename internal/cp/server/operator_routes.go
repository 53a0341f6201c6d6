package server

import (
	"context"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/webui"
	"github.com/drover-dev/drover/internal/wire/api"
)

// operatorRoute is one operator API route and the lowest token role that
// may call it (see api.Role). OperatorHandler registers exactly these and
// publicRoutes, so a route cannot be added without a role; the role test
// walks the same table.
type operatorRoute struct {
	method, pattern string
	role            api.Role
	h               httpapi.HandlerFunc
}

func (rt operatorRoute) key() string { return rt.method + " " + rt.pattern }

// operatorRoutes is the operator API. viewer: reads (secrets: names and
// versions only, never values); operator: everything that changes hosts,
// tasks, instances, allocations, terminals, slots, placements and workload
// secrets (an operator can read a secret through an instance it runs
// anyway); admin: tokens, signing keys and host revoke. Three reads are
// above viewer: the token list (admin), terminal recordings (operator:
// they hold everything typed and shown in a shell) and evidence bundles
// (operator: they queue a diag.collect and hold the agent's log lines).
func (s *Server) operatorRoutes() []operatorRoute {
	const (
		get, post, put, del     = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete
		viewer, operator, admin = api.RoleViewer, api.RoleOperator, api.RoleAdmin
	)
	return []operatorRoute{
		{get, "/api/v1/hosts", viewer, s.hosts.List},
		{post, "/api/v1/hosts", operator, s.hosts.Create},
		{get, "/api/v1/hosts/{id}", viewer, s.hosts.Show},
		{post, "/api/v1/hosts/{id}/enable", operator, s.hosts.SetEnabled(true)},
		{post, "/api/v1/hosts/{id}/disable", operator, s.hosts.SetEnabled(false)},
		{post, "/api/v1/hosts/{id}/rotate-token", operator, s.hosts.RotateToken},
		{post, "/api/v1/hosts/{id}/revoke", admin, s.hosts.Revoke},
		{get, "/api/v1/hosts/{id}/slots", viewer, s.hosts.ListSlots},
		{post, "/api/v1/hosts/{id}/slots", operator, s.hosts.ApproveSlots},
		{del, "/api/v1/hosts/{id}/slots/{slot_id}", operator, s.hosts.DeleteSlot},
		{post, "/api/v1/hosts/{id}/drain", operator, s.hosts.SetDraining(true)},
		{post, "/api/v1/hosts/{id}/undrain", operator, s.hosts.SetDraining(false)},
		{post, "/api/v1/hosts/{id}/profile", operator, s.hosts.SetProfile},
		{get, "/api/v1/preflight-runs", viewer, s.pre.List},
		{post, "/api/v1/preflight-runs", operator, s.pre.Create},
		{get, "/api/v1/preflight-runs/{id}", viewer, s.pre.Show},
		{get, "/api/v1/evidence/{correlation_id}", operator, s.pre.Evidence},
		{post, "/api/v1/placements/check", operator, s.inst.CheckPlacement},
		{get, "/api/v1/instances", viewer, s.inst.List},
		{post, "/api/v1/instances", operator, s.inst.Create},
		{get, "/api/v1/instances/{id}", viewer, s.inst.Show},
		{get, "/api/v1/instances/{id}/events", viewer, s.inst.Events},
		{get, "/api/v1/instances/{id}/logs", viewer, s.logs.Stream},
		{post, "/api/v1/instances/{id}/stop", operator, s.inst.SetDesired(api.DesiredStopped)},
		{post, "/api/v1/instances/{id}/start", operator, s.inst.SetDesired(api.DesiredRunning)},
		{del, "/api/v1/instances/{id}", operator, s.inst.Delete},
		{post, "/api/v1/instance-groups/{group}/scale", operator, s.inst.Scale},
		{get, "/api/v1/allocations", viewer, s.allocs.List},
		{post, "/api/v1/allocations", operator, s.allocs.Create},
		{get, "/api/v1/allocations/{id}", viewer, s.allocs.Show},
		{del, "/api/v1/allocations/{id}", operator, s.allocs.Release},
		{post, "/api/v1/allocations/{id}/terminal-token", operator, s.term.MintToken},
		{get, "/api/v1/allocations/{id}/sessions", viewer, s.term.ListAllocationSessions},
		{get, "/api/v1/terminal-sessions/{sid}", viewer, s.term.ShowSession},
		{get, "/api/v1/terminal-sessions/{sid}/recording", operator, s.term.Recording},
		{get, "/api/v1/tasks", viewer, s.tasks.List},
		{post, "/api/v1/tasks", operator, s.tasks.Create},
		{post, "/api/v1/tasks:batch", operator, s.tasks.CreateBatch},
		{get, "/api/v1/tasks/{id}", viewer, s.tasks.Show},
		{post, "/api/v1/tasks/{id}/cancel", operator, s.tasks.Cancel},
		{get, "/api/v1/task-types", viewer, s.tasks.Types},
		{get, "/api/v1/tokens", admin, s.ops.List},
		{post, "/api/v1/tokens", admin, s.ops.Create},
		{post, "/api/v1/tokens/{id}/revoke", admin, s.ops.Revoke},
		{get, "/api/v1/secrets", viewer, s.secrets.List},
		{get, "/api/v1/secrets/{name}", viewer, s.secrets.Show},
		{put, "/api/v1/secrets/{name}", operator, s.secrets.Set},
		{del, "/api/v1/secrets/{name}", operator, s.secrets.Delete},
		{get, "/api/v1/audit", viewer, s.audit.List},
		{post, "/api/v1/signing-keys/rotate", admin, s.rotateSigningKey},
		{get, "/api/v1/ca", viewer, s.showCA},
	}
}

// registerOperatorRoute serves rt on mux behind operatorAuth. A route
// without a valid role is a programming error: it panics at start-up
// rather than serve a route no token may call, or any token may.
func registerOperatorRoute(mux *http.ServeMux, s *Server, rt operatorRoute) {
	if !rt.role.Valid() {
		panic("operator route " + rt.key() + " has no valid role")
	}
	mux.Handle(rt.key(), s.operatorAuth(rt.role, rt.h))
}

// publicRoute is a route served without an operator token.
type publicRoute struct {
	pattern string // method included
	h       http.Handler
}

// publicRoutes are the operator listener's routes that take no operator
// token. Keep this list short: every other route belongs in
// operatorRoutes.
func (s *Server) publicRoutes() []publicRoute {
	ui := webui.Handler()
	out := []publicRoute{
		{"GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		})},
		{"GET /readyz", httpapi.Handle(s.log, s.readyz)},
		{"GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})},
		// The browser's terminal leg: the single-use terminal token (a
		// subprotocol), minted by an operator-role route, is its credential.
		{"GET /api/v1/terminal", http.HandlerFunc(s.term.Browser)},
		// The web console: its pages call the API above from the browser.
		{"GET /ui/", ui},
		{"GET /{$}", ui}, // "/" redirects to /ui/
	}
	// The dashboard: its session cookie (with a CSRF token on every POST)
	// stands for the operator token it calls the API with in-process.
	for _, rt := range s.dash.Routes() {
		out = append(out, publicRoute{rt.Pattern, rt.Handler})
	}
	return out
}

// Route is one route of the operator listener as docs/contract.md lists
// it: Auth is the lowest operator role that may call it, or "none".
type Route struct{ Method, Path, Auth string }

// OperatorRouteTable returns the operator listener's routes: those of
// operatorRoutes with their roles, then the public ones.
func (s *Server) OperatorRouteTable() []Route {
	var out []Route
	for _, rt := range s.operatorRoutes() {
		out = append(out, Route{rt.method, rt.pattern, string(rt.role)})
	}
	for _, rt := range s.publicRoutes() {
		method, path, _ := strings.Cut(rt.pattern, " ")
		out = append(out, Route{method, path, "none"})
	}
	return out
}

func (s *Server) showCA(w http.ResponseWriter, _ *http.Request) error {
	httpapi.WriteJSON(w, http.StatusOK, map[string]string{"ca_hash": s.ca.Hash(), "ca_pem": string(s.ca.CertPEM()), "node_url": s.cfg.NodeURL})
	return nil
}

// operatorAuth requires a valid operator bearer token whose role is at least
// min (httpapi.Auth); a refusal for a too-low role is audited.
func (s *Server) operatorAuth(min api.Role, next httpapi.HandlerFunc) http.Handler {
	a := &httpapi.Auth{Tokens: s.store, Now: s.cfg.Now, Log: s.log,
		Forbidden: func(ctx context.Context, p httpapi.Principal, route string, need api.Role) {
			s.audit.Record(ctx, audit.Entry{Actor: p.Actor(), Action: "operator.forbidden", Target: route,
				Result: "forbidden", CID: httpapi.CorrelationID(ctx), Detail: "requires=" + string(need)})
		}}
	return a.Require(min, next)
}
