package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

var dashboardSessionCases = []testCase{
	{"DashboardSession/Lifecycle", testDashboardSessionLifecycle},
	{"DashboardSession/KeepPerToken", testDashboardSessionKeepPerToken},
	{"DashboardSession/ListReplace", testDashboardSessionListReplace},
}

// testDashboardSessionLifecycle: a session reads back as created (its
// sealed token byte for byte), a second one under the same hash
// conflicts, a logout removes it (twice is not an error), and the expired
// sweep removes exactly the sessions whose expiry is not after now.
func testDashboardSessionLifecycle(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	_, err := s.GetDashboardSession(ctx, "nope")
	wantErr(t, err, store.ErrNotFound)
	sealed := []byte("drover-kek:v1:0123456789abcdef:\x00\x01\xfe\xff sealed")
	a := store.DashboardSession{IDHash: "hash-a", TokenID: "tok_a", Token: sealed, CSRF: "csrf-a", CreatedAt: base,
		ExpiresAt: at(time.Hour)}
	must(t, s.CreateDashboardSession(ctx, a, 0))
	got, err := s.GetDashboardSession(ctx, "hash-a")
	must(t, err)
	diff(t, "session", got, a)
	wantErr(t, s.CreateDashboardSession(ctx, store.DashboardSession{IDHash: "hash-a", Token: []byte("x")}, 0), store.ErrConflict)

	b := store.DashboardSession{IDHash: "hash-b", Token: []byte("b"), CSRF: "csrf-b", CreatedAt: base, ExpiresAt: at(2 * time.Hour)}
	must(t, s.CreateDashboardSession(ctx, b, 0))
	n, err := s.DeleteExpiredDashboardSessions(ctx, at(time.Hour)) // a expires at exactly this instant
	must(t, err)
	if n != 1 {
		t.Fatalf("expired sweep removed %d sessions, want 1", n)
	}
	_, err = s.GetDashboardSession(ctx, "hash-a")
	wantErr(t, err, store.ErrNotFound)

	must(t, s.DeleteDashboardSession(ctx, "hash-b"))
	must(t, s.DeleteDashboardSession(ctx, "hash-b"))
	_, err = s.GetDashboardSession(ctx, "hash-b")
	wantErr(t, err, store.ErrNotFound)
}

// testDashboardSessionKeepPerToken: a new session of a token that holds
// keep sessions already ends its oldest, in the same write; other tokens'
// sessions stay.
func testDashboardSessionKeepPerToken(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	mk := func(hash, token string, created time.Duration) store.DashboardSession {
		return store.DashboardSession{IDHash: hash, TokenID: token, Token: []byte("sealed"), CreatedAt: at(created),
			ExpiresAt: at(time.Hour)}
	}
	must(t, s.CreateDashboardSession(ctx, mk("other", "tok_b", 0), 2))
	for i, h := range []string{"a1", "a2", "a3", "a4"} {
		must(t, s.CreateDashboardSession(ctx, mk(h, "tok_a", time.Duration(i)*time.Second), 2))
	}
	for h, live := range map[string]bool{"a1": false, "a2": false, "a3": true, "a4": true, "other": true} {
		_, err := s.GetDashboardSession(ctx, h)
		if live && err != nil || !live && !errors.Is(err, store.ErrNotFound) {
			t.Errorf("session %s: %v, want live=%v", h, err, live)
		}
	}
}

// testDashboardSessionListReplace: every session is listed oldest first
// with its sealed token, and a token is replaced only while it is still
// the one read (ErrConflict otherwise, ErrNotFound for a session gone).
func testDashboardSessionListReplace(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	list, err := s.ListDashboardSessions(ctx)
	must(t, err)
	diff(t, "no sessions", list, []store.DashboardSession(nil))
	a := store.DashboardSession{IDHash: "hash-a", TokenID: "tok_a", Token: []byte("sealed-a\x00\xff"), CSRF: "ca",
		CreatedAt: at(time.Second), ExpiresAt: at(time.Hour)}
	b := store.DashboardSession{IDHash: "hash-b", TokenID: "tok_b", Token: []byte("sealed-b"), CSRF: "cb",
		CreatedAt: base, ExpiresAt: at(time.Hour)}
	must(t, s.CreateDashboardSession(ctx, a, 0))
	must(t, s.CreateDashboardSession(ctx, b, 0))
	list, err = s.ListDashboardSessions(ctx)
	must(t, err)
	diff(t, "sessions oldest first", list, []store.DashboardSession{b, a})

	wantErr(t, s.ReplaceDashboardSessionToken(ctx, "hash-a", []byte("not it"), []byte("new")), store.ErrConflict)
	wantErr(t, s.ReplaceDashboardSessionToken(ctx, "gone", a.Token, []byte("new")), store.ErrNotFound)
	must(t, s.ReplaceDashboardSessionToken(ctx, "hash-a", a.Token, []byte("resealed\xfe")))
	got, err := s.GetDashboardSession(ctx, "hash-a")
	must(t, err)
	a.Token = []byte("resealed\xfe")
	diff(t, "the replaced session", got, a)
}
