package hosts

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/prometheus/client_golang/prometheus"
)

// stateFake is a stateStore whose reads can be held after they took their
// snapshot: the snapshot is then older than what happens meanwhile.
type stateFake struct {
	mu                  sync.Mutex
	hosts               map[string]store.HostState
	gets, lists, sinces int
	since               time.Time // of the last ListHostStatesSince
	// hold, when set, makes the next read signal taken once it has its
	// snapshot and wait for release before returning it.
	hold *heldRead
}

type heldRead struct{ taken, release chan struct{} }

func (f *stateFake) snapshot() (map[string]store.HostState, *heldRead) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hold
	f.hold = nil
	return maps.Clone(f.hosts), h
}

func (f *stateFake) wait(h *heldRead) {
	if h != nil {
		close(h.taken)
		<-h.release
	}
}

func (f *stateFake) GetHostState(_ context.Context, id string) (store.HostState, error) {
	snap, h := f.snapshot()
	f.mu.Lock()
	f.gets++
	f.mu.Unlock()
	f.wait(h)
	hs, ok := snap[id]
	if !ok {
		return store.HostState{}, store.ErrNotFound
	}
	return hs, nil
}

func (f *stateFake) ListHostStates(context.Context) ([]store.HostState, error) {
	snap, h := f.snapshot()
	f.mu.Lock()
	f.lists++
	f.mu.Unlock()
	f.wait(h)
	out := make([]store.HostState, 0, len(snap))
	for _, hs := range snap {
		out = append(out, hs)
	}
	return out, nil
}

func (f *stateFake) ListHostStatesSince(_ context.Context, since time.Time) ([]store.HostState, error) {
	snap, h := f.snapshot()
	f.mu.Lock()
	f.sinces++
	f.since = since
	f.mu.Unlock()
	f.wait(h)
	var out []store.HostState
	for _, hs := range snap {
		if !hs.UpdatedAt.Before(since) {
			out = append(out, hs)
		}
	}
	return out, nil
}

func (f *stateFake) set(hs store.HostState) {
	f.mu.Lock()
	f.hosts[hs.ID] = hs
	f.mu.Unlock()
}

func (f *stateFake) counts() (gets, lists int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets, f.lists
}

func (f *stateFake) sinceCount() (int, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sinces, f.since
}

// holdNext holds the next read after its snapshot; the returned function
// lets it finish.
func (f *stateFake) holdNext() (taken <-chan struct{}, release func()) {
	h := &heldRead{taken: make(chan struct{}), release: make(chan struct{})}
	f.mu.Lock()
	f.hold = h
	f.mu.Unlock()
	return h.taken, func() { close(h.release) }
}

func liveHost(id string) store.HostState {
	return store.HostState{ID: id, Enabled: true, Status: api.HostHealthy,
		Capacity: json.RawMessage(`{"total":{"vcpus":4},"reserved":{},"allocated":{},"free":{"vcpus":4}}`)}
}

// TestHostCacheRefresh: the first refresh reads every host and answers
// their requests from memory; the next ones read only the hosts changed
// since, and keep the others' entries verified past hostCacheTTL. A host
// listed again keeps its decoded capacity when the stored bytes did not
// change. Every hostCacheFullEvery refreshes one reads every host again
// and drops the hosts that no longer exist. With no refresh, an entry
// older than hostCacheTTL is read again.
func TestHostCacheRefresh(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	f := &stateFake{hosts: map[string]store.HostState{"a": liveHost("a"), "b": liveHost("b")}}
	for id, hs := range f.hosts {
		hs.UpdatedAt = clock.Now().Add(-time.Hour)
		f.hosts[id] = hs
	}
	c := newHostCache(f, clock.Now)
	refresh := func() {
		t.Helper()
		clock.advance(hostCacheRefresh)
		if err := c.refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	get := func(id string) hostState {
		t.Helper()
		hs, err := c.get(t.Context(), id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		return hs
	}
	refresh()
	first := get("a")
	if !first.enabled || first.capacity == nil || first.capacity.Free.VCPUs != 4 {
		t.Fatalf("a after refresh = %+v", first)
	}
	get("b")
	if gets, lists := f.counts(); gets != 0 || lists != 1 {
		t.Fatalf("%d single reads and %d full ones after the first refresh, want 0 and 1", gets, lists)
	}

	// a is disabled; b does not change for longer than hostCacheTTL.
	disabled := f.hosts["a"]
	disabled.Enabled, disabled.UpdatedAt = false, clock.Now()
	f.set(disabled)
	for range 3 {
		refresh()
	}
	if get("a").enabled {
		t.Fatal("a change the refreshes read is not cached")
	}
	if get("b").capacity == nil {
		t.Fatal("b lost its entry")
	}
	if gets, lists := f.counts(); gets != 0 || lists != 1 {
		t.Fatalf("%d single reads and %d full ones, want 0 and 1: the refreshes of changes did not verify b", gets, lists)
	}
	if n, _ := f.sinceCount(); n != 3 {
		t.Fatalf("%d reads of changes, want 3", n)
	}

	delete(f.hosts, "b")
	for range hostCacheFullEvery - 4 {
		refresh()
	}
	get("b") // only a full read sees that b no longer exists
	if _, lists := f.counts(); lists != 1 {
		t.Fatalf("%d full reads before the %dth refresh, want 1", lists, hostCacheFullEvery+1)
	}
	refresh()
	if _, lists := f.counts(); lists != 2 {
		t.Fatalf("%d full reads after the %dth refresh, want 2", lists, hostCacheFullEvery+1)
	}
	if get("a").capacity != first.capacity {
		t.Error("an unchanged capacity was decoded again")
	}
	if _, err := c.get(t.Context(), "b"); err == nil {
		t.Fatal("a deleted host is still cached after a full refresh")
	}

	clock.advance(hostCacheTTL) // no refresh: a's entry is too old
	get("a")
	if gets, _ := f.counts(); gets != 2 {
		t.Fatalf("%d single reads; want 2 (deleted b, expired a)", gets)
	}
}

// TestHostCacheRefreshSince: a refresh of changes reads from
// hostCacheSkew before the last refresh began, so a change dated a little
// earlier (by a replica whose clock is behind, or a write that committed
// late) is read. One dated earlier still is read by the next full
// refresh. After change events were lost, the next refresh reads every
// host.
func TestHostCacheRefreshSince(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	f := &stateFake{hosts: map[string]store.HostState{"a": liveHost("a"), "b": liveHost("b")}}
	c := newHostCache(f, clock.Now)
	refresh := func() time.Time {
		t.Helper()
		began := clock.Now()
		if err := c.refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		clock.advance(hostCacheRefresh)
		return began
	}
	cached := func(id string) hostState {
		t.Helper()
		hs, err := c.get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return hs
	}
	last := refresh() // full
	revoked := f.hosts["b"]
	revoked.Revoked, revoked.UpdatedAt = true, last.Add(-hostCacheSkew)
	f.set(revoked)
	began := refresh()
	if _, since := f.sinceCount(); !since.Equal(last.Add(-hostCacheSkew)) {
		t.Fatalf("read changes since %v, want %v", since, last.Add(-hostCacheSkew))
	}
	if !cached("b").revoked {
		t.Fatal("a revocation dated before the last refresh began was missed")
	}

	disabled := f.hosts["a"]
	disabled.Enabled, disabled.UpdatedAt = false, began.Add(-hostCacheSkew-time.Millisecond)
	f.set(disabled)
	for range hostCacheFullEvery - 2 {
		refresh()
	}
	if !cached("a").enabled {
		t.Fatal("a change dated beyond hostCacheSkew was read by a refresh of changes (the test's premise is off)")
	}
	refresh() // the full one
	if cached("a").enabled {
		t.Fatal("the full refresh did not read a change dated beyond hostCacheSkew")
	}

	c.invalidateAll()
	_, lists := f.counts()
	refresh()
	if _, after := f.counts(); after != lists+1 {
		t.Fatal("the refresh after lost events did not read every host")
	}
	refresh()
	if _, after := f.counts(); after != lists+1 {
		t.Fatal("the refresh after that read every host again")
	}
}

// TestHostCacheRefreshLetsReadersIn: a refresh builds its entries (the
// clock is read then) without holding the lock that every node request's
// read waits for, and stores all of them.
func TestHostCacheRefreshLetsReadersIn(t *testing.T) {
	const n = 1000
	f := &stateFake{hosts: map[string]store.HostState{}}
	for i := range n {
		f.hosts[fmt.Sprintf("h%04d", i)] = liveHost(fmt.Sprintf("h%04d", i))
	}
	var c *hostCache
	reads, held := 0, 0
	c = newHostCache(f, func() time.Time {
		reads++
		if !c.mu.TryLock() {
			held++
		} else {
			c.mu.Unlock()
		}
		return time.Now()
	})
	if err := c.refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if reads == 0 || held != 0 {
		t.Errorf("the cache's lock was held at %d of the refresh's %d clock reads", held, reads)
	}
	c.mu.RLock()
	cached := len(c.hosts)
	c.mu.RUnlock()
	if cached != n {
		t.Fatalf("%d hosts cached after the refresh, want %d", cached, n)
	}
}

// TestHostCacheReadRacesChange: a store read that took its snapshot before
// a change never caches the state the change replaced: revoking a host
// while a refresh or a single read is in flight, or while events were
// lost, takes effect at once.
func TestHostCacheReadRacesChange(t *testing.T) {
	revoked := liveHost("n1")
	revoked.Revoked = true
	for _, tc := range []struct {
		name   string
		read   func(c *hostCache) error
		change func(c *hostCache, f *stateFake)
		// lost says change events were lost: the next refresh reads every
		// host again.
		lost bool
	}{
		{"refresh, then event", func(c *hostCache) error { return c.refresh(context.Background()) },
			func(c *hostCache, f *stateFake) { f.set(revoked); c.invalidate("n1") }, false},
		{"single read, then event", func(c *hostCache) error { _, err := c.get(context.Background(), "n1"); return err },
			func(c *hostCache, f *stateFake) { f.set(revoked); c.invalidate("n1") }, false},
		{"refresh, then events lost", func(c *hostCache) error { return c.refresh(context.Background()) },
			func(c *hostCache, f *stateFake) { f.set(revoked); c.invalidateAll() }, true},
		{"refresh, then this replica's write", func(c *hostCache) error { return c.refresh(context.Background()) },
			func(c *hostCache, f *stateFake) {
				f.set(revoked)
				c.put(store.Host{ID: "n1", Enabled: true, Revoked: true, Status: api.HostHealthy})
			}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &testClock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
			f := &stateFake{hosts: map[string]store.HostState{"n1": liveHost("n1")}}
			c := newHostCache(f, clock.Now)
			taken, release := f.holdNext()
			done := make(chan error, 1)
			go func() { done <- tc.read(c) }()
			<-taken // the read has the host as it was
			tc.change(c, f)
			release()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			hs, err := c.get(t.Context(), "n1")
			if err != nil {
				t.Fatal(err)
			}
			if !hs.revoked {
				t.Fatal("the read from before the revocation was cached: the revoked node is let in")
			}
			// Once no read is in flight, reads cache again.
			before, _ := f.counts()
			if _, err := c.get(t.Context(), "n1"); err != nil {
				t.Fatal(err)
			}
			if after, _ := f.counts(); after != before {
				t.Fatalf("a read after the race was not cached (%d single reads, then %d)", before, after)
			}
			_, lists := f.counts()
			if err := c.refresh(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, after := f.counts(); (after > lists) != (tc.lost || lists == 0) {
				t.Fatalf("the next refresh read every host: %v, want %v", after > lists, tc.lost || lists == 0)
			}
		})
	}
}

// slowPut is a store whose first host update pauses after its commit,
// before its caller caches the row: a writer that is slow to cache.
type slowPut struct {
	Store
	calls              atomic.Int32
	committed, release chan struct{}
}

func (s *slowPut) UpdateHostAudited(ctx context.Context, id string, fn func(*store.Host) error,
	audit func(before, after store.Host) []store.AuditEvent) (store.Host, error) {
	h, err := s.Store.UpdateHostAudited(ctx, id, fn, audit)
	if s.calls.Add(1) == 1 {
		close(s.committed)
		<-s.release
	}
	return h, err
}

// TestHostWritesCachedInCommitOrder: a host's second write waits until
// the first one's row is cached, so a writer slow to cache never puts an
// older row over a newer one (a capabilities report committed before the
// first heartbeat's healthy status, cached after it, left the host
// "unknown" in the cache).
func TestHostWritesCachedInCommitOrder(t *testing.T) {
	rs := newReplicas(t, "n1")
	st := &slowPut{Store: rs.st, committed: make(chan struct{}), release: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(Config{HeartbeatInterval: testInterval, Log: log, Now: rs.clock.Now}, st, nil, nil, nil,
		audit.New(rs.st, rs.clock.Now, log), NewMetrics(prometheus.NewRegistry()))
	ctx := t.Context()
	first := make(chan error, 1)
	go func() { // the capabilities report: the status as read, unknown
		_, err := s.updateHost(ctx, "n1", func(h *store.Host) error { h.Hostname = "h1"; return nil }, nil)
		first <- err
	}()
	<-st.committed
	second := make(chan error, 1)
	go func() { // the first heartbeat's transition
		_, err := s.updateHost(ctx, "n1", func(h *store.Host) error { h.Status = api.HostHealthy; return nil }, nil)
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("the host's second write ran (%v) before the first one's row was cached", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(st.release)
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if hs, err := s.cache.get(ctx, "n1"); err != nil || hs.status != api.HostHealthy {
		t.Fatalf("cached status %q (%v), want healthy", hs.status, err)
	}
}
