package hosts

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/fnv"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// hostCacheTTL bounds how stale a cached host may be if a change event was
// lost; change events normally invalidate entries at once.
const hostCacheTTL = 10 * time.Second

// hostCacheRefresh is how often the cache rereads the store (refresh), so
// that an entry in use never reaches hostCacheTTL and each node request is
// answered from memory: a fleet of 20,000 agents would otherwise reload
// 2,000 hosts a second one row at a time.
const hostCacheRefresh = hostCacheTTL / 2

// hostCacheFullEvery is how many refreshes make one that reads every host;
// the others read only the hosts changed since the one before.
const hostCacheFullEvery = 12

// hostCacheSkew is how long before the last refresh began the next one
// starts reading changes: a change a write dated before it committed, or a
// replica whose clock is behind this one's by less, is not missed. Every
// change is read about (hostCacheRefresh + hostCacheSkew) /
// hostCacheRefresh times, so the margin is not larger: a fleet changes
// all the time (each health probe's result is a change), and with 30 s
// the refreshes at 19,000 hosts read as many rows as full reads did.
const hostCacheSkew = hostCacheRefresh

// hostState is the part of a host record every node request needs.
type hostState struct {
	enabled    bool
	revoked    bool
	status     api.HostStatus
	enrolledAt time.Time
	capacity   *api.CapacityReport // last stored capacity, to write only changes
	// capacityJSON is capacity as stored, so a refresh that reads the same
	// bytes keeps capacity instead of decoding it again.
	capacityJSON json.RawMessage
	// failure is the stored last failure (signal and correlation id), so a
	// heartbeat reporting the same one writes nothing.
	failure  store.Failure
	loadedAt time.Time
	// round is the refresh round the entry was last read or written in;
	// a refresh drops the entries of older rounds it did not list (hosts
	// that no longer exist).
	round uint64
}

// stateStore is what the cache reads (store.HostStore has it).
type stateStore interface {
	GetHostState(ctx context.Context, id string) (store.HostState, error)
	ListHostStates(ctx context.Context) ([]store.HostState, error)
	ListHostStatesSince(ctx context.Context, since time.Time) ([]store.HostState, error)
}

// hostCache keeps node-request authorisation off the database hot path.
//
// Entries come from three places: a read of one host when an entry is
// missing or older than hostCacheTTL (get); a read of the hosts changed
// since the last refresh every hostCacheRefresh, and of every host at
// start and every hostCacheFullEvery refreshes (refresh); and the record a
// write returned (put). A change event drops the entry (invalidate). A
// read that was in flight when the event came may hold the state from
// before the change, so while reads are in flight the cache remembers
// what was invalidated, and such a read caches nothing for it: a
// revocation is never undone by a snapshot read before it.
type hostCache struct {
	st  stateStore
	now func() time.Time

	// writes serialise this replica's writes of a host with their put,
	// by a stripe of the host id (lockWrite).
	writes [hostWriteStripes]sync.Mutex

	mu    sync.RWMutex
	hosts map[string]hostState
	round uint64 // refresh rounds begun
	// verified is when the last refresh that succeeded began: every entry
	// cached then was as stored then, or was dropped or replaced since.
	verified time.Time
	// fullNext says the next refresh reads every host: none has yet, or
	// change events were lost.
	fullNext bool
	// loads counts the store reads in flight; while there are any,
	// dropped has the ids invalidated since the oldest began, and
	// droppedAll says invalidateAll ran.
	loads      int
	dropped    map[string]struct{}
	droppedAll bool
}

func newHostCache(st stateStore, now func() time.Time) *hostCache {
	return &hostCache{st: st, now: now, hosts: make(map[string]hostState), dropped: make(map[string]struct{}),
		fullNext: true}
}

// get returns the cached state, loading it from the store when absent or old.
func (c *hostCache) get(ctx context.Context, id string) (hostState, error) {
	c.mu.RLock()
	hs, ok := c.hosts[id]
	verified := c.verified
	c.mu.RUnlock()
	if ok && c.now().Sub(later(hs.loadedAt, verified)) < hostCacheTTL {
		return hs, nil
	}
	c.mu.Lock()
	c.loads++
	c.mu.Unlock()
	h, err := c.st.GetHostState(ctx, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.loadDone()
	if err != nil {
		return hostState{}, err
	}
	hs = c.state(h, c.hosts[id])
	c.keep(h.ID, hs)
	return hs, nil
}

// refresh rereads the store: the hosts changed since the last refresh
// (those whose UpdatedAt is at most hostCacheSkew before the last refresh
// began), or every host at the first refresh, after lost change events
// and every hostCacheFullEvery. It replaces the entries of the hosts read
// and marks every entry verified; a full read also drops the entries of
// hosts that no longer exist. The store sets UpdatedAt on every change to
// what the cache holds, so an entry a refresh did not read is unchanged
// since the one before, which verified it.
//
// Reading every host each time cost ≈ 60–75 ms of CPU and ≈ 48 MB of
// allocation per refresh at 20,000 hosts (BenchmarkHostCache), a burst
// that heartbeats queued behind every few seconds on a busy machine.
// Hosts are never deleted (a decommissioned one is revoked, which is a
// change), so the full read is only the backstop for a change dated more
// than hostCacheSkew before this replica's clock (a replica's clock that
// far behind) whose event was lost too.
//
// Every node request reads the cache, so refresh holds the write lock
// only to store what it built beforehand: the entries are built (their
// capacity decoded where it changed) from the previous ones, read under
// the read lock, with no lock held. Building them under the write lock
// kept every heartbeat waiting for tens of milliseconds each
// hostCacheRefresh at 19,000 hosts, and far longer on a busy machine,
// where the holder waited for a core meanwhile. The read in flight
// (loads) keeps what is invalidated meanwhile from being overwritten, as
// for get.
func (c *hostCache) refresh(ctx context.Context) error {
	began := c.now()
	c.mu.Lock()
	c.loads++
	c.round++
	round := c.round
	full := c.fullNext || round%hostCacheFullEvery == 1
	since := c.verified.Add(-hostCacheSkew)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.loadDone()
		c.mu.Unlock()
	}()
	var states []store.HostState
	var err error
	if full {
		states, err = c.st.ListHostStates(ctx)
	} else {
		states, err = c.st.ListHostStatesSince(ctx, since)
	}
	if err != nil {
		return err
	}
	built := make([]hostState, len(states))
	c.mu.RLock()
	for i, h := range states {
		built[i] = c.hosts[h.ID]
	}
	c.mu.RUnlock()
	now := c.now()
	for i, h := range states {
		built[i] = stateOf(h, built[i], round, now)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range states {
		c.keep(h.ID, built[i])
	}
	c.verified = began
	if !full {
		return nil
	}
	c.fullNext = c.droppedAll // events lost during the read: again
	// Hosts the read did not list no longer exist. Entries of this round
	// were stored since (by get, put or this refresh).
	for id, hs := range c.hosts {
		if hs.round < round {
			delete(c.hosts, id)
		}
	}
	return nil
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// state is the cache entry for h, reusing prev's decoded capacity when
// the stored bytes are the same. c.mu must be held.
func (c *hostCache) state(h store.HostState, prev hostState) hostState {
	return stateOf(h, prev, c.round, c.now())
}

// stateOf is the cache entry for h, read in refresh round round at now.
func stateOf(h store.HostState, prev hostState, round uint64, now time.Time) hostState {
	hs := hostState{enabled: h.Enabled, revoked: h.Revoked, status: h.Status,
		enrolledAt: h.EnrolledAt, failure: h.LastFailure, loadedAt: now, round: round}
	if len(h.Capacity) > 0 {
		if prev.capacity != nil && bytes.Equal(prev.capacityJSON, h.Capacity) {
			hs.capacity, hs.capacityJSON = prev.capacity, prev.capacityJSON
		} else {
			var capa api.CapacityReport
			if json.Unmarshal(h.Capacity, &capa) == nil {
				hs.capacity, hs.capacityJSON = &capa, h.Capacity
			}
		}
	}
	return hs
}

// keep caches what a store read returned unless the host was invalidated
// while the read was in flight. c.mu must be held.
func (c *hostCache) keep(id string, hs hostState) {
	if c.droppedAll {
		return
	}
	if _, ok := c.dropped[id]; ok {
		return
	}
	c.hosts[id] = hs
}

// loadDone ends a store read; c.mu must be held.
func (c *hostCache) loadDone() {
	if c.loads--; c.loads == 0 {
		clear(c.dropped)
		c.droppedAll = false
	}
}

// hostWriteStripes is how many locks the hosts' writes share.
const hostWriteStripes = 256

// lockWrite locks host id's writes on this replica until unlock: a write
// and the put of the row it returned run under it, so one host's rows
// reach the cache in the order they were committed. Without it a slower
// writer could cache an older row over a newer one: a capabilities report
// committed before the first heartbeat's healthy status, and cached after
// it, left the host "unknown" here until the next refresh, refusing its
// log streams as node_offline; a heartbeat's row read before a revocation
// could likewise undo it in the cache. Other replicas' writes reach the
// cache as change events (invalidate).
func (c *hostCache) lockWrite(id string) (unlock func()) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	mu := &c.writes[h.Sum32()%hostWriteStripes]
	mu.Lock()
	return mu.Unlock
}

// put caches a host record the caller just wrote (under lockWrite). A
// store read in flight may have begun before the write, so it does not
// replace this entry.
func (c *hostCache) put(h store.Host) hostState {
	c.mu.Lock()
	defer c.mu.Unlock()
	hs := c.state(h.State(), c.hosts[h.ID])
	c.hosts[h.ID] = hs
	if c.loads > 0 {
		c.dropped[h.ID] = struct{}{}
	}
	return hs
}

// invalidate drops a host's entry (its record changed).
func (c *hostCache) invalidate(id string) {
	c.mu.Lock()
	delete(c.hosts, id)
	if c.loads > 0 {
		c.dropped[id] = struct{}{}
	}
	c.mu.Unlock()
}

// invalidateAll drops every entry (change events were lost), and makes
// the next refresh read every host.
func (c *hostCache) invalidateAll() {
	c.mu.Lock()
	clear(c.hosts)
	c.fullNext = true
	if c.loads > 0 {
		c.droppedAll = true
	}
	c.mu.Unlock()
}
