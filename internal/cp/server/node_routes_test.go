package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
)

// TestNodeRoutes: NodeHandler serves every route of the node API table
// (the handler answers, not the mux with 404/405) and nothing outside it
// but /healthz.
func TestNodeRoutes(t *testing.T) {
	e := newRoleEnv(t)
	var table []string
	for _, rt := range nodeapi.Routes() {
		table = append(table, rt.MuxPattern())
	}
	var served []string
	for p := range e.s.nodeRoutes() {
		served = append(served, p)
	}
	slices.Sort(table)
	slices.Sort(served)
	if !slices.Equal(served, table) {
		t.Errorf("NodeHandler registers\n%q\nthe table is\n%q", served, table)
	}

	h := e.s.NodeHandler()
	do := func(method, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(t.Context(), method, path, strings.NewReader(""))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	methods := []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch}
	for _, rt := range nodeapi.Routes() {
		t.Run(rt.Name, func(t *testing.T) {
			path := pathParam.ReplaceAllString(rt.Pattern, "nope")
			w := do(rt.Method, path)
			var eb api.ErrorBody
			if w.Code >= 400 && (json.Unmarshal(w.Body.Bytes(), &eb) != nil || eb.Error.Code == "") {
				t.Fatalf("%s %s: %d %q, not an answer of the route's handler", rt.Method, path, w.Code, w.Body.String())
			}
			if rt.Auth == nodeapi.AuthNodeCert && (w.Code != http.StatusUnauthorized || eb.Error.Code != "client_certificate_required") {
				t.Errorf("%s %s without a certificate: %d %s, want 401 client_certificate_required", rt.Method, path, w.Code, eb.Error.Code)
			}
			for _, m := range methods {
				if m == rt.Method {
					continue
				}
				if w := do(m, path); w.Code != http.StatusMethodNotAllowed {
					t.Errorf("%s %s: %d, want 405 (the table has only %s)", m, path, w.Code, rt.Method)
				}
			}
		})
	}
	for _, path := range []string{"/", "/internal/v1/nodes/nope", "/internal/v1/nodes/nope/", "/internal/v1/nodes/nope/tasks/x",
		"/internal/v1/nodes/nope/instances/x", "/internal/v1/nodes/nope/terminal", "/api/v1/hosts", "/metrics", "/readyz"} {
		if w := do(http.MethodGet, path); w.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, w.Code)
		}
	}
	if w := do(http.MethodGet, "/healthz"); w.Code != http.StatusOK {
		t.Errorf("GET /healthz: %d", w.Code)
	}
}
