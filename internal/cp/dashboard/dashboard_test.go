package dashboard

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

// fakeAPI answers the hosts list and records POSTs; tokens "op" and "view".
func newTestServer(t *testing.T) (*httptest.Server, *[]string) {
	return newTestServerWith(t, nil)
}

// newTestServerWith is newTestServer with its Config changed by with.
func newTestServerWith(t *testing.T, with func(*Config)) (*httptest.Server, *[]string) {
	var posts []string
	apiMux := http.NewServeMux()
	apiMux.HandleFunc("GET /api/v1/hosts", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer gone" {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(401, "operator_token_invalid", "revoked"))
			return
		}
		now := time.Now()
		httpapi.WriteJSON(w, 200, []api.Host{{ID: "h1", OSFamily: "linux", Status: api.HostHealthy, SelectedAccel: "tcg",
			LastSeenAt: &now, HeartbeatInterval: api.Duration(time.Second)}})
	})
	apiMux.HandleFunc("POST /api/v1/hosts/{id}/drain", func(w http.ResponseWriter, r *http.Request) {
		posts = append(posts, r.URL.Path+" "+r.Header.Get("Authorization"))
		httpapi.WriteJSON(w, 200, map[string]any{})
	})
	cfg := Config{API: apiMux, Authenticate: func(_ context.Context, tok string) (httpapi.Principal, error) {
		switch tok {
		case "op":
			return httpapi.Principal{Name: "alice", TokenID: "tok_op", Role: api.RoleOperator}, nil
		case longToken:
			return httpapi.Principal{Name: "alice", TokenID: "tok_long", Role: api.RoleOperator}, nil
		case "gone": // valid at login, revoked by the first page
			return httpapi.Principal{Name: "carol", TokenID: "tok_gone", Role: api.RoleOperator}, nil
		case "view":
			return httpapi.Principal{Name: "bob", TokenID: "tok_view", Role: api.RoleViewer}, nil
		}
		return httpapi.Principal{}, httpapi.Errorf(401, "operator_token_invalid", "no")
	}}
	if with != nil {
		with(&cfg)
	}
	u := New(cfg)
	mux := http.NewServeMux()
	for _, rt := range u.Routes() {
		mux.Handle(rt.Pattern, rt.Handler)
	}
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts, &posts
}

// longToken is an operator token long enough not to occur by chance in
// its sealed form.
const longToken = "drv_op_0123456789abcdef0123456789abcdef"

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, c *http.Client, u string, form url.Values) int {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// login logs in with tok and returns the client and the session's CSRF token.
func login(t *testing.T, ts *httptest.Server, tok string) (*http.Client, string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	_, body := get(t, c, ts.URL+"/ui/login")
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("login page has no CSRF field: %s", body)
	}
	if st := post(t, c, ts.URL+"/ui/login", url.Values{"token": {"op"}}); st != http.StatusForbidden {
		t.Errorf("login without CSRF: %d, want 403", st)
	}
	if st := post(t, c, ts.URL+"/ui/login", url.Values{"token": {tok}, "csrf": {m[1]}}); st != http.StatusOK {
		t.Fatalf("login: %d", st)
	}
	st, body := get(t, c, ts.URL+"/ui/fleet")
	m = csrfRe.FindStringSubmatch(body)
	if st != 200 || m == nil || !strings.Contains(body, `id="host-h1"`) {
		t.Fatalf("fleet after login: %d %s", st, body)
	}
	return c, m[1]
}

func TestSessionCookieAttributes(t *testing.T) {
	ts, _ := newTestServer(t)
	c, _ := login(t, ts, "op")
	u, _ := url.Parse(ts.URL + "/ui/")
	if len(c.Jar.Cookies(u)) != 1 {
		t.Fatalf("cookies: %v", c.Jar.Cookies(u))
	}
	for _, c := range []struct {
		name, url  string
		behindTLS  bool // Config.SecureCookies: a proxy in front terminates TLS
		wantSecure bool
	}{
		{"https", "https://x/ui/login", false, true},
		{"plain http", "http://x/ui/login", false, false},
		{"plain http behind a TLS proxy", "http://x/ui/login", true, true},
	} {
		u := New(Config{SecureCookies: c.behindTLS})
		rec := httptest.NewRecorder()
		u.setCookie(rec, httptest.NewRequest("GET", c.url, nil), sessionCookie, "v", 60)
		sc := rec.Header().Get("Set-Cookie")
		for _, want := range []string{"HttpOnly", "SameSite=Strict", "Path=/ui/"} {
			if !strings.Contains(sc, want) {
				t.Errorf("%s: Set-Cookie %q lacks %s", c.name, sc, want)
			}
		}
		if got := strings.Contains(sc, "; Secure"); got != c.wantSecure {
			t.Errorf("%s: Set-Cookie %q: Secure %v, want %v", c.name, sc, got, c.wantSecure)
		}
	}
}

func TestCSRFAndRoles(t *testing.T) {
	ts, posts := newTestServer(t)
	// Not logged in: pages redirect to the login, POSTs are refused.
	jar, _ := cookiejar.New(nil)
	anon := &http.Client{Jar: jar}
	if _, body := get(t, anon, ts.URL+"/ui/fleet"); !strings.Contains(body, `id="token"`) {
		t.Error("fleet without a session did not show the login form")
	}
	if st := post(t, anon, ts.URL+"/ui/hosts/h1/actions/drain", nil); st != http.StatusUnauthorized {
		t.Errorf("anonymous POST: %d", st)
	}

	op, csrf := login(t, ts, "op")
	if st := post(t, op, ts.URL+"/ui/hosts/h1/actions/drain", nil); st != http.StatusForbidden {
		t.Errorf("POST without CSRF: %d, want 403", st)
	}
	if st := post(t, op, ts.URL+"/ui/hosts/h1/actions/drain", url.Values{"csrf": {"wrong"}}); st != http.StatusForbidden {
		t.Errorf("POST with a wrong CSRF: %d, want 403", st)
	}
	op.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if st := post(t, op, ts.URL+"/ui/hosts/h1/actions/drain", url.Values{"csrf": {csrf}}); st != http.StatusSeeOther {
		t.Errorf("operator drain: %d", st)
	}
	if len(*posts) != 1 || (*posts)[0] != "/api/v1/hosts/h1/drain Bearer op" {
		t.Errorf("API calls: %q", *posts)
	}

	view, vcsrf := login(t, ts, "view")
	if st := post(t, view, ts.URL+"/ui/hosts/h1/actions/drain", url.Values{"csrf": {vcsrf}}); st != http.StatusForbidden {
		t.Errorf("viewer drain with CSRF: %d, want 403", st)
	}
	if st := post(t, view, ts.URL+"/ui/hosts/h1/actions/drain", url.Values{"csrf": {csrf}}); st != http.StatusForbidden {
		t.Errorf("viewer drain with another session's CSRF: %d, want 403", st)
	}
	if len(*posts) != 1 {
		t.Errorf("viewer reached the API: %q", *posts)
	}

	// Logout ends the session.
	if st := post(t, op, ts.URL+"/ui/logout", url.Values{"csrf": {csrf}}); st != http.StatusSeeOther {
		t.Errorf("logout: %d", st)
	}
	if st := post(t, op, ts.URL+"/ui/hosts/h1/actions/drain", url.Values{"csrf": {csrf}}); st != http.StatusUnauthorized {
		t.Errorf("POST after logout: %d", st)
	}
}

func TestBadTokenLogin(t *testing.T) {
	ts, _ := newTestServer(t)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	_, body := get(t, c, ts.URL+"/ui/login")
	m := csrfRe.FindStringSubmatch(body)
	resp, err := c.PostForm(ts.URL+"/ui/login", url.Values{"token": {"nope"}, "csrf": {m[1]}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !strings.Contains(resp.Request.URL.RawQuery, "error=invalid") {
		t.Errorf("bad token landed on %s", resp.Request.URL)
	}
}

// TestRevokedTokenEndsSession: once the API refuses the session's token
// (revoked or expired), the page ends the session and shows the login.
func TestRevokedTokenEndsSession(t *testing.T) {
	ts, _ := newTestServer(t)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	_, body := get(t, c, ts.URL+"/ui/login")
	m := csrfRe.FindStringSubmatch(body)
	resp, err := c.PostForm(ts.URL+"/ui/login", url.Values{"token": {"gone"}, "csrf": {m[1]}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Path != "/ui/login" || !strings.Contains(resp.Request.URL.RawQuery, "error=invalid") {
		t.Errorf("a revoked token's fleet page landed on %s", resp.Request.URL)
	}
	u, _ := url.Parse(ts.URL + "/ui/")
	for _, ck := range jar.Cookies(u) {
		if ck.Name == sessionCookie {
			t.Errorf("session cookie kept: %v", ck)
		}
	}
}
