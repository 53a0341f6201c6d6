package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi/parktest"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// countingStore counts the claims that reach the store; afterClaim, when
// set, runs after each (before the claim's answer is used). A claim whose
// request ended meanwhile fails with the context's error, as the store's
// own would had the agent left during it.
type countingStore struct {
	store.Store
	claims     atomic.Int64
	afterClaim atomic.Pointer[func()]
}

func (c *countingStore) ClaimTasks(ctx context.Context, nodeID string, now time.Time, l store.ClaimLeases, max int,
	audit func([]store.Task) []store.AuditEvent) ([]store.Task, error) {
	c.claims.Add(1)
	ts, err := c.Store.ClaimTasks(ctx, nodeID, now, l, max, audit)
	if f := c.afterClaim.Load(); f != nil {
		(*f)()
	}
	if err == nil && ctx.Err() != nil {
		return nil, fmt.Errorf("look for a queued task: %w", ctx.Err())
	}
	return ts, err
}

// fakeNodes answers whether a node is revoked: revoked.
type fakeNodes struct{ revoked, panics atomic.Bool }

func (f *fakeNodes) NodeRevoked(context.Context, string) (bool, error) {
	if f.panics.Load() {
		panic("node lookup bug")
	}
	return f.revoked.Load(), nil
}

type fakeSigner struct{}

func (fakeSigner) Sign(api.TaskClaims) (string, error) { return "signed", nil }
func (fakeSigner) SigningKID() string                  { return "k1" }

// newWaitRoom is a tasks room on SQLite with host n1, nothing subscribed
// to the store's change events (every event is lost unless the room wakes
// its own waiters), and the given fallback interval.
func newWaitRoom(t *testing.T, fallback time.Duration) (*Room, *countingStore) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	if err := st.CreateHost(t.Context(), store.Host{ID: "n1", OSFamily: api.OSLinux, Enabled: true, Status: api.HostHealthy,
		EnrolledAt: now, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	reg, err := task.NewRegistry(task.Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: st}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := New(Config{Registry: reg, MaxWait: time.Minute, FallbackPoll: fallback, Log: log, Now: time.Now},
		cs, &fakeNodes{}, nil, fakeSigner{}, audit.New(st, time.Now, log), NewMetrics(prometheus.NewRegistry()))
	return r, cs
}

// wait runs one long-poll of n1 with a 30 ms timeout and returns its status.
func wait(t *testing.T, r *Room, m parktest.Mode) int {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/internal/v1/nodes/n1/tasks/wait?timeout=30ms", nil)
	w, err := m.Start(t, r.Wait, req, "n1").Wait(t)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	return w.Code
}

// echoTask is a queued diag.echo task for n1.
func echoTask(t *testing.T, r *Room) store.Task {
	return r.NewTask(t.Context(), "n1", task.TypeEcho, json.RawMessage(`{}`), time.Hour)
}

// TestQuietNodeParksWithoutClaim: a node whose last wait found nothing
// parks the next one without a claim, until a wake (an enqueue on this
// replica, a change event, the fallback check) ends its quiet; a task
// whose event was lost is delivered after the fallback check. Without the
// fallback check every wait claims.
func TestQuietNodeParksWithoutClaim(t *testing.T) {
	for _, m := range parktest.Modes() {
		t.Run(m.String(), func(t *testing.T) { testQuietNodeParksWithoutClaim(t, m) })
	}
}

func testQuietNodeParksWithoutClaim(t *testing.T, m parktest.Mode) {
	r, cs := newWaitRoom(t, time.Hour) // the fallback runs only when the test calls it
	step := func(name string, wantStatus int, wantClaims int64) {
		t.Helper()
		before := cs.claims.Load()
		if got := wait(t, r, m); got != wantStatus {
			t.Fatalf("%s: status %d, want %d", name, got, wantStatus)
		}
		if got := cs.claims.Load() - before; got != wantClaims {
			t.Fatalf("%s: %d claims, want %d", name, got, wantClaims)
		}
	}
	step("first wait", http.StatusNoContent, 1)
	step("quiet", http.StatusNoContent, 0)
	step("still quiet", http.StatusNoContent, 0)

	if err := r.Enqueue(t.Context(), echoTask(t, r)); err != nil { // wakes n1 on this replica
		t.Fatal(err)
	}
	step("after an enqueue", http.StatusOK, 1)
	step("after a delivery", http.StatusNoContent, 1)
	step("quiet again", http.StatusNoContent, 0)

	if err := cs.EnqueueTask(t.Context(), echoTask(t, r)); err != nil { // its event is lost: nobody listens
		t.Fatal(err)
	}
	step("event lost", http.StatusNoContent, 0)
	r.Wake("n1") // what the change event does
	step("after a change event", http.StatusOK, 1)
	step("quiet once more", http.StatusNoContent, 1)

	if err := cs.EnqueueTask(t.Context(), echoTask(t, r)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	r.cfg.FallbackPoll = 10 * time.Millisecond
	done := make(chan struct{})
	go func() { r.RunFallback(ctx); close(done) }()
	for deadline := time.Now().Add(5 * time.Second); r.waiters.Quiet("n1"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the fallback check did not end n1's quiet")
		}
	}
	cancel()
	<-done
	step("after the fallback check", http.StatusOK, 1)

	step("claims after a delivery", http.StatusNoContent, 1)
	step("quiet before WakeAll", http.StatusNoContent, 0)
	r.WakeAll() // store events resynchronised
	step("after WakeAll", http.StatusNoContent, 1)

	r.cfg.FallbackPoll = 0
	step("no fallback: claims", http.StatusNoContent, 1)
	step("no fallback: claims again", http.StatusNoContent, 1)
}
