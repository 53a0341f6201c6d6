package dashboard

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
)

// sharedSessions is a store and a KEK ring for replicas that share their
// sessions.
func sharedSessions(t *testing.T) (*sqlite.Store, *kek.Ring) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), sqlite.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, kek.NewRing(newKEK(t))
}

// newKEK is a random key-encryption key.
func newKEK(t *testing.T) *kek.Key {
	t.Helper()
	raw := make([]byte, kek.Size)
	rand.Read(raw)
	k, err := kek.New(raw)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sessionCookieOf is the browser's session cookie as it would send it to ts.
func sessionCookieOf(t *testing.T, c *http.Client, ts *httptest.Server) *http.Cookie {
	t.Helper()
	u, _ := url.Parse(ts.URL + "/ui/")
	for _, ck := range c.Jar.Cookies(u) {
		if ck.Name == sessionCookie {
			return ck
		}
	}
	t.Fatal("no session cookie")
	return nil
}

// fleetWith asks ts for the fleet page with only the session cookie ck
// and reports whether it was served (not sent to the login page).
func fleetWith(t *testing.T, ts *httptest.Server, ck *http.Cookie) bool {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, ts.URL+"/ui/fleet", nil)
	req.AddCookie(ck)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestSessionsSharedByReplicas: with a store and a KEK, a session begun on
// one replica serves the browser on another, its operator token is sealed
// in the store (never the cookie, nor the token in plaintext), a logout
// on either ends it on both, and so do its expiry and its token's
// revocation.
func TestSessionsSharedByReplicas(t *testing.T) {
	st, ring := sharedSessions(t)
	var skew atomic.Int64 // added to the replicas' clocks
	var revoked atomic.Bool
	share := func(c *Config) {
		c.Sessions, c.Sealer = st, ring
		c.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
		auth := c.Authenticate
		c.Authenticate = func(ctx context.Context, tok string) (httpapi.Principal, error) {
			if revoked.Load() {
				return httpapi.Principal{}, httpapi.Errorf(http.StatusUnauthorized, "operator_token_invalid", "revoked")
			}
			return auth(ctx, tok)
		}
	}
	a, _ := newTestServerWith(t, share)
	b, _ := newTestServerWith(t, share)

	c, csrf := login(t, a, longToken)
	ck := sessionCookieOf(t, c, a)
	if !fleetWith(t, b, ck) {
		t.Fatal("the other replica did not serve the session")
	}
	ds, err := st.GetDashboardSession(t.Context(), hashOf(ck.Value))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(ds.Token, []byte(longToken)) || bytes.Contains(ds.Token, []byte(ck.Value)) {
		t.Fatal("the store holds the operator token or the cookie in plaintext")
	}
	if ds.CSRF != csrf {
		t.Fatalf("stored CSRF token %q, the page's %q", ds.CSRF, csrf)
	}

	if st := post(t, c, b.URL+"/ui/logout", url.Values{"csrf": {csrf}}); st != http.StatusOK {
		t.Fatalf("logout on the other replica: %d", st)
	}
	if fleetWith(t, a, ck) || fleetWith(t, b, ck) {
		t.Fatal("the session outlived its logout on a replica")
	}

	c, _ = login(t, b, longToken)
	ck = sessionCookieOf(t, c, b)
	skew.Store(int64(SessionTTL))
	if fleetWith(t, a, ck) {
		t.Fatal("an expired session was served")
	}
	skew.Store(0)

	c, _ = login(t, a, longToken)
	ck = sessionCookieOf(t, c, a)
	revoked.Store(true)
	if fleetWith(t, b, ck) {
		t.Fatal("a revoked token's session was served")
	}
}

// TestSessionsWithoutKEKStayInMemory: without a KEK (or without a store)
// sessions are the replica's own, and nothing is written to the store.
func TestSessionsWithoutKEKStayInMemory(t *testing.T) {
	st, _ := sharedSessions(t)
	noKEK := func(c *Config) { c.Sessions = st }
	a, _ := newTestServerWith(t, noKEK)
	b, _ := newTestServerWith(t, noKEK)
	c, _ := login(t, a, longToken)
	ck := sessionCookieOf(t, c, a)
	if !fleetWith(t, a, ck) || fleetWith(t, b, ck) {
		t.Fatal("a session in memory was not served by its replica only")
	}
	if _, err := st.GetDashboardSession(t.Context(), hashOf(ck.Value)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a session without a KEK reached the store: %v", err)
	}
}

// failingDelete is a session store whose deletes fail.
type failingDelete struct{ SessionStore }

func (failingDelete) DeleteDashboardSession(context.Context, string) error {
	return errors.New("store unreachable")
}

// TestLogoutThatCannotRemoveTheSession: a logout the store cannot record
// says so, with a correlation id, and keeps the browser's cookie, instead
// of showing the login page while the session still works elsewhere.
func TestLogoutThatCannotRemoveTheSession(t *testing.T) {
	st, ring := sharedSessions(t)
	a, _ := newTestServerWith(t, func(c *Config) { c.Sessions, c.Sealer = failingDelete{st}, ring })
	c, csrf := login(t, a, longToken)
	resp, err := c.PostForm(a.URL+"/ui/logout", url.Values{"csrf": {csrf}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "correlation id cid_") {
		t.Fatalf("logout with a failing store: %d %s", resp.StatusCode, body)
	}
	if !fleetWith(t, a, sessionCookieOf(t, c, a)) {
		t.Fatal("the browser lost a session that still exists")
	}
}

// TestSessionsPerTokenBounded: one operator token keeps at most
// maxSessionsPerToken sessions, in the store and in memory: a login beyond
// ends its oldest session, and another token's session stays.
func TestSessionsPerTokenBounded(t *testing.T) {
	st, ring := sharedSessions(t)
	for name, mutate := range map[string]func(*Config){
		"store":  func(c *Config) { c.Sessions, c.Sealer = st, ring },
		"memory": func(*Config) {},
	} {
		t.Run(name, func(t *testing.T) {
			var tick atomic.Int64 // a clock a second further on each reading: no two logins at one instant
			start := time.Now()
			a, _ := newTestServerWith(t, func(c *Config) {
				mutate(c)
				c.Now = func() time.Time { return start.Add(time.Duration(tick.Add(1)) * time.Second) }
			})
			c, _ := login(t, a, "view")
			other := sessionCookieOf(t, c, a)
			var cookies []*http.Cookie
			for range maxSessionsPerToken + 1 {
				c, _ := login(t, a, "op")
				cookies = append(cookies, sessionCookieOf(t, c, a))
			}
			if fleetWith(t, a, cookies[0]) {
				t.Errorf("the token's oldest session outlived %d newer ones", maxSessionsPerToken)
			}
			for i, ck := range cookies[1:] {
				if !fleetWith(t, a, ck) {
					t.Fatalf("session %d of %d ended", i+2, len(cookies))
				}
			}
			if !fleetWith(t, a, other) {
				t.Error("another token's session ended")
			}
		})
	}
}

// TestResealSessionsAfterKEKRotation: after a KEK rotation the sessions'
// operator tokens are sealed with the new KEK, so the session still works
// once the old KEK is dropped and the old KEK opens none of them; a
// session no KEK of the ring opens is deleted, and a second run changes
// nothing.
func TestResealSessionsAfterKEKRotation(t *testing.T) {
	st, _ := sharedSessions(t)
	oldKey, newKey := newKEK(t), newKEK(t)
	oldRing := kek.NewRing(oldKey)
	a, _ := newTestServerWith(t, func(c *Config) { c.Sessions, c.Sealer = st, oldRing })
	c, _ := login(t, a, longToken)
	ck := sessionCookieOf(t, c, a)
	strangers := kek.NewRing(newKEK(t)) // a KEK this deployment never had
	foreign, err := strangers.Seal(sealName("hash-foreign"), []byte(longToken))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDashboardSession(t.Context(), store.DashboardSession{IDHash: "hash-foreign", Token: foreign,
		CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}, 0); err != nil {
		t.Fatal(err)
	}

	rotated := kek.NewRing(newKey, oldKey)
	n, err := ResealSessions(t.Context(), st, rotated, slog.New(slog.DiscardHandler))
	if err != nil || n != 1 {
		t.Fatalf("reseal: %d, %v; want 1 session sealed again", n, err)
	}
	ds, err := st.GetDashboardSession(t.Context(), hashOf(ck.Value))
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := kek.KeyID(ds.Token); id != newKey.ID() {
		t.Errorf("the session is sealed with KEK %q, want the new %q", id, newKey.ID())
	}
	if _, err := oldRing.Open(sealName(ds.IDHash), ds.Token); err == nil {
		t.Error("the old KEK still opens the session's operator token")
	}
	if _, err := st.GetDashboardSession(t.Context(), "hash-foreign"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a session no KEK opens: %v, want deleted", err)
	}
	b, _ := newTestServerWith(t, func(c *Config) { c.Sessions, c.Sealer = st, kek.NewRing(newKey) })
	if !fleetWith(t, b, ck) {
		t.Error("the session did not survive the old KEK's retirement")
	}
	if n, err := ResealSessions(t.Context(), st, rotated, slog.New(slog.DiscardHandler)); err != nil || n != 0 {
		t.Errorf("a second run: %d, %v; want nothing to do", n, err)
	}
}
