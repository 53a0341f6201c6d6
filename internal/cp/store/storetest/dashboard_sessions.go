package storetest

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

var dashboardSessionCases = []testCase{
	{"DashboardSession/Lifecycle", testDashboardSessionLifecycle},
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
	a := store.DashboardSession{IDHash: "hash-a", Token: sealed, CSRF: "csrf-a", CreatedAt: base, ExpiresAt: at(time.Hour)}
	must(t, s.CreateDashboardSession(ctx, a))
	got, err := s.GetDashboardSession(ctx, "hash-a")
	must(t, err)
	diff(t, "session", got, a)
	wantErr(t, s.CreateDashboardSession(ctx, store.DashboardSession{IDHash: "hash-a", Token: []byte("x")}), store.ErrConflict)

	b := store.DashboardSession{IDHash: "hash-b", Token: []byte("b"), CSRF: "csrf-b", CreatedAt: base, ExpiresAt: at(2 * time.Hour)}
	must(t, s.CreateDashboardSession(ctx, b))
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
