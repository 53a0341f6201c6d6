package dashboard

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

// newActionServer is a dashboard over a fake API with the host h1, tokens
// "admin", "op" and "view" (roles enforced like the API's), recording the
// rotate-token, revoke and evidence calls.
func newActionServer(t *testing.T) (*httptest.Server, func() []string) {
	var mu sync.Mutex
	var calls []string
	role := map[string]api.Role{"Bearer admin": api.RoleAdmin, "Bearer op": api.RoleOperator, "Bearer view": api.RoleViewer}
	need := func(min api.Role, h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !role[r.Header.Get("Authorization")].AtLeast(min) {
				httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(403, "forbidden", "requires role %s", min))
				return
			}
			mu.Lock()
			calls = append(calls, r.Method+" "+r.URL.Path)
			mu.Unlock()
			h(w, r)
		}
	}
	now := time.Now()
	host := api.Host{ID: "h1", OSFamily: "linux", Status: api.HostHealthy, LastSeenAt: &now,
		HeartbeatInterval: api.Duration(time.Second), LastFailureCorrelationID: "cid-fail"}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/hosts", func(w http.ResponseWriter, r *http.Request) { httpapi.WriteJSON(w, 200, []api.Host{host}) })
	mux.HandleFunc("GET /api/v1/hosts/{id}", func(w http.ResponseWriter, r *http.Request) { httpapi.WriteJSON(w, 200, host) })
	mux.HandleFunc("GET /api/v1/hosts/{id}/slots", func(w http.ResponseWriter, r *http.Request) { httpapi.WriteJSON(w, 200, []api.Slot{}) })
	mux.HandleFunc("GET /api/v1/audit", func(w http.ResponseWriter, r *http.Request) { httpapi.WriteJSON(w, 200, []api.AuditEvent{}) })
	mux.HandleFunc("GET /api/v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, []api.Task{{ID: "t1", Type: "diag.health_probe", CorrelationID: "cid-t1", CreatedAt: now}})
	})
	mux.HandleFunc("POST /api/v1/hosts/{id}/rotate-token", need(api.RoleOperator, func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, api.BootstrapToken{HostID: r.PathValue("id"), Token: "drv_bt_SECRET", ExpiresAt: now.Add(time.Hour),
			CAHash: "sha256:abc", NodeURL: "https://cp:8443"})
	}))
	mux.HandleFunc("POST /api/v1/hosts/{id}/revoke", need(api.RoleAdmin, func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, host)
	}))
	mux.HandleFunc("GET /api/v1/evidence/{cid}", need(api.RoleOperator, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = w.Write([]byte("\x1f\x8bbundle"))
	}))
	u := New(Config{API: mux, Authenticate: func(_ context.Context, tok string) (httpapi.Principal, error) {
		if r, ok := role["Bearer "+tok]; ok {
			return httpapi.Principal{Name: tok, Role: r}, nil
		}
		return httpapi.Principal{}, httpapi.Errorf(401, "operator_token_invalid", "no")
	}})
	dm := http.NewServeMux()
	for _, rt := range u.Routes() {
		dm.Handle(rt.Pattern, rt.Handler)
	}
	ts := httptest.NewServer(dm)
	t.Cleanup(ts.Close)
	return ts, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), calls...) }
}

func postResp(t *testing.T, c *http.Client, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, b.String()
}

func TestViewerHasNoHostActions(t *testing.T) {
	ts, calls := newActionServer(t)
	view, csrf := login(t, ts, "view")
	_, body := get(t, view, ts.URL+"/ui/hosts/h1")
	for _, no := range []string{"act-rotate-token", "act-revoke", "/ui/evidence/"} {
		if strings.Contains(body, no) {
			t.Errorf("viewer's host page shows %s", no)
		}
	}
	for _, a := range []string{"rotate-token", "revoke"} {
		resp, _ := postResp(t, view, ts.URL+"/ui/hosts/h1/actions/"+a, url.Values{"csrf": {csrf}, "confirm": {"h1"}})
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("viewer's forged %s: %d, want 403", a, resp.StatusCode)
		}
	}
	if st, _ := get(t, view, ts.URL+"/ui/evidence/cid-t1"); st != http.StatusForbidden {
		t.Errorf("viewer's evidence download: %d, want 403", st)
	}
	if c := calls(); len(c) != 0 {
		t.Errorf("viewer reached the API: %q", c)
	}
}

func TestRotateTokenShownOnce(t *testing.T) {
	ts, calls := newActionServer(t)
	op, csrf := login(t, ts, "op")
	_, page := get(t, op, ts.URL+"/ui/hosts/h1")
	if !strings.Contains(page, `id="act-rotate-token"`) || strings.Contains(page, `id="act-revoke"`) {
		t.Errorf("operator's host page: rotate %v, revoke %v (revoke is admin only)",
			strings.Contains(page, `id="act-rotate-token"`), strings.Contains(page, `id="act-revoke"`))
	}
	resp, body := postResp(t, op, ts.URL+"/ui/hosts/h1/actions/rotate-token", url.Values{"csrf": {csrf}})
	if resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("rotate: %d, Cache-Control %q", resp.StatusCode, resp.Header.Get("Cache-Control"))
	}
	for _, want := range []string{"NODE_AGENT_HOST_ID=h1", "NODE_AGENT_BOOTSTRAP_TOKEN=drv_bt_SECRET",
		"NODE_AGENT_CONTROL_PLANE_URL=https://cp:8443", "NODE_AGENT_CA_HASH=sha256:abc"} {
		if !strings.Contains(body, want) {
			t.Errorf("token page lacks %s", want)
		}
	}
	if _, page := get(t, op, ts.URL+"/ui/hosts/h1"); strings.Contains(page, "drv_bt_SECRET") {
		t.Error("the token is shown again on the host page")
	}
	if c := calls(); len(c) != 1 || c[0] != "POST /api/v1/hosts/h1/rotate-token" {
		t.Errorf("API calls: %q", c)
	}
	if resp, _ := postResp(t, op, ts.URL+"/ui/hosts/h1/actions/revoke", url.Values{"csrf": {csrf}, "confirm": {"h1"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("operator revoke: %d, want 403", resp.StatusCode)
	}
}

func TestRevokeNeedsConfirmation(t *testing.T) {
	ts, calls := newActionServer(t)
	adm, csrf := login(t, ts, "admin")
	if _, page := get(t, adm, ts.URL+"/ui/hosts/h1"); !strings.Contains(page, `id="act-revoke"`) {
		t.Error("admin's host page has no revoke")
	}
	for _, confirm := range []url.Values{{"csrf": {csrf}}, {"csrf": {csrf}, "confirm": {"h2"}}, {"csrf": {csrf}, "confirm": {"H1"}}} {
		resp, body := postResp(t, adm, ts.URL+"/ui/hosts/h1/actions/revoke", confirm)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `id="confirm-error"`) {
			t.Errorf("revoke with %v: %d %s", confirm, resp.StatusCode, body)
		}
	}
	if c := calls(); len(c) != 0 {
		t.Fatalf("unconfirmed revoke reached the API: %q", c)
	}
	resp, _ := postResp(t, adm, ts.URL+"/ui/hosts/h1/actions/revoke", url.Values{"csrf": {csrf}, "confirm": {"h1"}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "done=revoked") {
		t.Errorf("confirmed revoke: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if c := calls(); len(c) != 1 || c[0] != "POST /api/v1/hosts/h1/revoke" {
		t.Errorf("API calls: %q", c)
	}
}

func TestEvidenceDownload(t *testing.T) {
	ts, _ := newActionServer(t)
	op, _ := login(t, ts, "op")
	_, page := get(t, op, ts.URL+"/ui/hosts/h1")
	for _, want := range []string{`href="/ui/evidence/cid-fail"`, `href="/ui/evidence/cid-t1"`} {
		if !strings.Contains(page, want) {
			t.Errorf("host page lacks %s", want)
		}
	}
	resp, err := op.Get(ts.URL + "/ui/evidence/cid-t1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/gzip" ||
		resp.Header.Get("Content-Disposition") != `attachment; filename="evidence-cid-t1.tar.gz"` {
		t.Errorf("evidence: %d %v", resp.StatusCode, resp.Header)
	}
}
