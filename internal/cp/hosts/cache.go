package hosts

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// hostCacheTTL bounds how stale a cached host may be if a change event was
// lost; change events normally invalidate entries at once.
const hostCacheTTL = 10 * time.Second

// hostState is the part of a host record every node request needs.
type hostState struct {
	enabled    bool
	revoked    bool
	status     api.HostStatus
	enrolledAt time.Time
	capacity   *api.CapacityReport // last stored capacity, to write only changes
	// failure is the stored last failure (signal and correlation id), so a
	// heartbeat reporting the same one writes nothing.
	failure  store.Failure
	loadedAt time.Time
}

// hostCache keeps node-request authorisation off the database hot path.
type hostCache struct {
	st  Store
	now func() time.Time

	mu    sync.RWMutex
	hosts map[string]hostState
}

func newHostCache(st Store, now func() time.Time) *hostCache {
	return &hostCache{st: st, now: now, hosts: make(map[string]hostState)}
}

// get returns the cached state, loading it from the store when absent or old.
func (c *hostCache) get(ctx context.Context, id string) (hostState, error) {
	c.mu.RLock()
	hs, ok := c.hosts[id]
	c.mu.RUnlock()
	if ok && c.now().Sub(hs.loadedAt) < hostCacheTTL {
		return hs, nil
	}
	h, err := c.st.GetHost(ctx, id)
	if err != nil {
		return hostState{}, err
	}
	return c.put(h), nil
}

// put caches a host record the caller just read or wrote.
func (c *hostCache) put(h store.Host) hostState {
	hs := hostState{enabled: h.Enabled, revoked: h.Revoked, status: h.Status,
		enrolledAt: h.EnrolledAt, failure: h.LastFailure, loadedAt: c.now()}
	if len(h.Capacity) > 0 {
		var capa api.CapacityReport
		if json.Unmarshal(h.Capacity, &capa) == nil {
			hs.capacity = &capa
		}
	}
	c.mu.Lock()
	c.hosts[h.ID] = hs
	c.mu.Unlock()
	return hs
}

func (c *hostCache) invalidate(id string) {
	c.mu.Lock()
	delete(c.hosts, id)
	c.mu.Unlock()
}
