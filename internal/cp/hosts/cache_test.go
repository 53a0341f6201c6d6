package hosts

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// stateFake is a stateStore whose reads can be held after they took their
// snapshot: the snapshot is then older than what happens meanwhile.
type stateFake struct {
	mu          sync.Mutex
	hosts       map[string]store.HostState
	gets, lists int
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

// TestHostCacheRefresh: one refresh answers every host's requests from
// memory until hostCacheTTL, keeps the decoded capacity when the stored
// bytes did not change, and drops hosts that no longer exist.
func TestHostCacheRefresh(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	f := &stateFake{hosts: map[string]store.HostState{"a": liveHost("a"), "b": liveHost("b")}}
	c := newHostCache(f, clock.Now)
	if err := c.refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	first, err := c.get(t.Context(), "a")
	if err != nil || !first.enabled || first.capacity == nil || first.capacity.Free.VCPUs != 4 {
		t.Fatalf("a after refresh = %+v, %v", first, err)
	}
	if _, err := c.get(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	if gets, _ := f.counts(); gets != 0 {
		t.Fatalf("%d single reads after a refresh, want 0", gets)
	}

	delete(f.hosts, "b") // b deleted; a unchanged
	clock.advance(hostCacheRefresh)
	if err := c.refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	again, _ := c.get(t.Context(), "a")
	if again.capacity != first.capacity {
		t.Error("an unchanged capacity was decoded again")
	}
	if _, err := c.get(t.Context(), "b"); err == nil {
		t.Fatal("a deleted host is still cached after a refresh")
	}

	clock.advance(hostCacheTTL) // no refresh: a's entry is too old
	if _, err := c.get(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if gets, lists := f.counts(); gets != 2 || lists != 2 {
		t.Fatalf("reads: %d single, %d lists; want 2 (deleted b, expired a) and 2", gets, lists)
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
	}{
		{"refresh, then event", func(c *hostCache) error { return c.refresh(context.Background()) },
			func(c *hostCache, f *stateFake) { f.set(revoked); c.invalidate("n1") }},
		{"single read, then event", func(c *hostCache) error { _, err := c.get(context.Background(), "n1"); return err },
			func(c *hostCache, f *stateFake) { f.set(revoked); c.invalidate("n1") }},
		{"refresh, then events lost", func(c *hostCache) error { return c.refresh(context.Background()) },
			func(c *hostCache, f *stateFake) { f.set(revoked); c.invalidateAll() }},
		{"refresh, then this replica's write", func(c *hostCache) error { return c.refresh(context.Background()) },
			func(c *hostCache, f *stateFake) {
				f.set(revoked)
				c.put(store.Host{ID: "n1", Enabled: true, Revoked: true, Status: api.HostHealthy})
			}},
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
		})
	}
}
