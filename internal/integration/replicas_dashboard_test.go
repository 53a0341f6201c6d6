package integration

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/pgtest"
)

var dashCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestDashboardSessionAcrossReplicas: a browser that logged in to the
// dashboard on one replica is served by the other (no sticky load
// balancer), and its logout there ends the session on both: the sessions
// live in PostgreSQL, their operator tokens sealed with the KEK.
func TestDashboardSessionAcrossReplicas(t *testing.T) {
	if pg == nil {
		pgtest.Skip(t, pgErr)
	}
	dsn := pg.NewDatabase(t)
	r1 := startEnv(t, openPostgresDSN(t, dsn))
	r2 := startEnv(t, openPostgresDSN(t, dsn))

	jar, _ := cookiejar.New(nil) // cookies are per host, not per port: one browser
	browser := &http.Client{Jar: jar}
	page := func(c *http.Client, u string) (int, string, string) {
		t.Helper()
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Request.URL.Path, string(b)
	}
	_, _, body := page(browser, r1.opURL+"/ui/login")
	m := dashCSRF.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("login page: %s", body)
	}
	resp, err := browser.PostForm(r1.opURL+"/ui/login", url.Values{"token": {r1.opToken}, "csrf": {m[1]}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Path != "/ui/fleet" {
		t.Fatalf("login on replica 1 landed on %s", resp.Request.URL)
	}

	st, path, body := page(browser, r2.opURL+"/ui/fleet")
	if st != http.StatusOK || path != "/ui/fleet" {
		t.Fatalf("replica 2 with replica 1's session: %d at %s", st, path)
	}
	m = dashCSRF.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("fleet page on replica 2 has no form token: %s", body)
	}
	u, _ := url.Parse(r1.opURL + "/ui/")
	var cookie *http.Cookie
	for _, c := range jar.Cookies(u) {
		if c.Name == "drover_session" {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatal("no session cookie")
	}

	resp, err = browser.PostForm(r2.opURL+"/ui/logout", url.Values{"csrf": {m[1]}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Path != "/ui/login" {
		t.Fatalf("logout on replica 2 landed on %s", resp.Request.URL)
	}
	// The cookie a copy of the browser kept no longer opens replica 1.
	req, _ := http.NewRequest(http.MethodGet, r1.opURL+"/ui/fleet", nil)
	req.AddCookie(cookie)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasSuffix(resp.Header.Get("Location"), "/ui/login") {
		t.Fatalf("replica 1 after the logout on replica 2: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}
