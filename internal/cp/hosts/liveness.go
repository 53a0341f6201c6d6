package hosts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"hash/maphash"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// staleAfter is how many missed heartbeat intervals make a host stale.
const staleAfter = 3

// liveness keeps heartbeats in memory. The store sees a host's heartbeat
// only on a status transition or in the coalesced flush: one batched
// statement per interval for every host heard from since the last one.
//
// A heartbeat that changes nothing (same status, no new failure, same
// capacity) costs a map lookup under its shard's lock and no allocation:
// the host's entry is made on its first heartbeat and reused, and the
// digest of its last heartbeat body is kept with its decoded form, so an
// identical body is not decoded again, and an agent may send the digest
// (If-Match, the ETag it was answered) instead of the body. Entries of
// hosts not heard from for staleAfter intervals are dropped at the next
// flush, so the map holds at most the hosts heard from lately.
//
// The hosts are spread over liveShards locks by a hash of their id. With
// one lock for the whole fleet, tens of thousands of heartbeats a second
// queue on it whenever they arrive together (after a pause of the whole
// process, or a wait on the host cache), and Go's mutex then hands it to
// each waiter in turn, each waiting to be scheduled: a convoy. At
// 25,000 heartbeats/s from 19,000 agents they waited 178 s in all over
// 20 s (docs/performance.md, "Heartbeat latency: stalls, not the
// average").
type liveness struct {
	s *Room
	// started is when the replica started: it marks no host stale before
	// it has been up for staleAfter intervals itself.
	started time.Time

	seed   maphash.Seed
	shards [liveShards]liveShard

	// flushMu makes flushes one at a time; batch is their reused buffer.
	flushMu sync.Mutex
	batch   []store.Seen
}

// liveShards is how many locks liveness spreads its hosts over.
const liveShards = 64

// liveShard is one lock's share of the hosts.
type liveShard struct {
	mu    sync.Mutex
	hosts map[string]*beatEntry
}

// beatEntry is what liveness keeps of one host.
type beatEntry struct {
	seen  time.Time // the latest heartbeat heard
	dirty bool      // seen is newer than what this replica last wrote
	// sum is the digest of the last heartbeat body, as received, and tag
	// its ETag header value (nil before the first); hb is that body decoded.
	sum bodySum
	tag []string
	hb  api.Heartbeat
}

// bodySum is a heartbeat body's digest: SHA-256, truncated to 128 bits.
type bodySum [16]byte

func sumOf(body []byte) bodySum {
	full := sha256.Sum256(body)
	return bodySum(full[:16])
}

// etag is the strong entity tag of the body with digest sum.
func (b bodySum) etag() string { return `"` + hex.EncodeToString(b[:]) + `"` }

func newLiveness(s *Room) *liveness {
	l := &liveness{s: s, started: s.cfg.Now(), seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].hosts = make(map[string]*beatEntry)
	}
	return l
}

// shard is the share of the hosts id is in.
func (l *liveness) shard(id string) *liveShard {
	return &l.shards[maphash.String(l.seed, id)%liveShards]
}

// decoded returns the heartbeat the host last sent, and its ETag, if that
// body's digest is sum, so an unchanged heartbeat is not decoded again.
func (l *liveness) decoded(id string, sum bodySum) (api.Heartbeat, []string, bool) {
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.hosts[id]; e != nil && e.tag != nil && e.sum == sum {
		return e.hb, e.tag, true
	}
	return api.Heartbeat{}, nil, false
}

// matched returns the heartbeat the host last sent if etag is its ETag: a
// body-less heartbeat with If-Match repeats that one.
func (l *liveness) matched(id, etag string) (api.Heartbeat, []string, bool) {
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.hosts[id]; e != nil && e.tag != nil && e.tag[0] == etag {
		return e.hb, e.tag, true
	}
	return api.Heartbeat{}, nil, false
}

// remember keeps hb, decoded from a body with digest sum, as the host's
// last heartbeat, and returns its ETag header value.
func (l *liveness) remember(id string, sum bodySum, hb api.Heartbeat) []string {
	tag := []string{sum.etag()} // never modified once set: shared by answers
	sh := l.shard(id)
	sh.mu.Lock()
	e := sh.entry(id)
	e.sum, e.tag, e.hb = sum, tag, hb
	sh.mu.Unlock()
	return tag
}

// entry is id's entry, made on first use; sh.mu must be held.
func (sh *liveShard) entry(id string) *beatEntry {
	e := sh.hosts[id]
	if e == nil {
		e = &beatEntry{}
		sh.hosts[id] = e
	}
	return e
}

// seen records a heartbeat heard at at (never lowering a newer one); dirty
// says it is still to be written.
func (l *liveness) seen(id string, at time.Time, dirty bool) {
	sh := l.shard(id)
	sh.mu.Lock()
	e := sh.entry(id)
	if at.After(e.seen) {
		e.seen = at
	}
	e.dirty = e.dirty || dirty
	sh.mu.Unlock()
}

// beat records a heartbeat from a host whose cached state is hs and that
// should now have status (healthy, or a problem the agent reported in o).
// It writes to the store only on a status change or a new reported failure;
// otherwise it only marks the host seen for the next flush.
func (l *liveness) beat(ctx context.Context, id string, hs hostState, at time.Time, o observation) error {
	if hs.status != o.status || o.newFailure(hs) {
		var prev api.HostStatus
		reason := orDefault(o.reason, "heartbeat")
		_, err := l.s.updateHost(ctx, id, func(h *store.Host) error {
			prev = h.Status
			h.Status, h.StatusReason = o.status, o.reason
			if o.differs(h.LastFailure) {
				h.LastFailure = o.failure
			}
			if at.After(h.LastSeenAt) {
				h.LastSeenAt = at
			}
			return nil
		}, l.s.auditStatus(ctx, reason, o.cid))
		if err != nil {
			return err
		}
		l.seen(id, at, false) // written above: not dirty unless a later one is
		if prev != o.status {
			l.s.statusChanged(id, prev, o.status, reason, o.cid)
		}
		return nil
	}
	l.seen(id, at, true)
	return nil
}

// flush writes the coalesced heartbeats in one batch, and drops the
// entries of hosts not heard from for staleAfter intervals.
func (l *liveness) flush(ctx context.Context) {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	forget := l.s.cfg.Now().Add(-staleAfter * l.s.cfg.HeartbeatInterval)
	batch := l.batch[:0]
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for id, e := range sh.hosts {
			switch {
			case e.dirty:
				batch = append(batch, store.Seen{HostID: id, At: e.seen})
				e.dirty = false
			case e.seen.Before(forget):
				delete(sh.hosts, id)
			}
		}
		sh.mu.Unlock()
	}
	l.batch = batch
	if len(batch) == 0 {
		return
	}

	cids := make(map[string]string) // of the revived hosts, for the log
	revived, err := l.s.store.TouchHosts(ctx, batch, func(id string) store.AuditEvent {
		cids[id] = httpapi.NewID("cid_")
		return l.s.statusRecord(ctx, id, api.HostStale, api.HostHealthy, "heartbeat", cids[id])
	})
	if err != nil {
		l.s.log.Warn("flush heartbeats", "err", err, "hosts", len(batch))
		for _, b := range batch { // keep them for the next flush
			l.seen(b.HostID, b.At, true)
		}
		return
	}
	for _, id := range revived {
		l.s.cache.invalidate(id)
		l.s.statusChanged(id, api.HostStale, api.HostHealthy, "heartbeat", cids[id])
	}
}

// sweep flushes, then marks hosts stale after staleAfter missed intervals.
//
// A replica that started less than staleAfter intervals ago marks none:
// the agents may have had no control plane to reach (all replicas were
// down, or this one only just started) and are still reconnecting, all at
// once after a restart. As in the Kubernetes node lifecycle controller,
// silence counts from when this replica could first have heard the host;
// another replica that was up meanwhile marks stale hosts as usual.
func (l *liveness) sweep(ctx context.Context) {
	l.flush(ctx)
	now := l.s.cfg.Now()
	if now.Sub(l.started) < staleAfter*l.s.cfg.HeartbeatInterval {
		return
	}
	cutoff := now.Add(-staleAfter * l.s.cfg.HeartbeatInterval)
	cids := make(map[string]string) // of the hosts marked, for the log
	ids, err := l.s.store.MarkStale(ctx, cutoff, func(id string, lastSeen time.Time) store.StaleMark {
		if heard := l.heardAfter(id, cutoff); !heard.IsZero() {
			return store.StaleMark{HeardAt: heard}
		}
		// The stale host's last failure, under a correlation id of its own
		// that the audit record carries too.
		cid := httpapi.NewID("cid_")
		cids[id] = cid
		return store.StaleMark{
			Failure: store.Failure{Signal: string(signal.HeartbeatStale), CorrelationID: cid, At: l.s.cfg.Now().UTC(),
				Detail: "no heartbeat since " + lastSeen.Format(time.RFC3339)},
			Audit: l.s.statusRecord(ctx, id, "heartbeating", api.HostStale, string(signal.HeartbeatStale), cid),
		}
	})
	if err != nil && ctx.Err() == nil {
		l.s.log.Warn("mark stale hosts", "err", err, "marked", len(ids)) // the next sweep marks the rest
	}
	for _, id := range ids {
		l.s.cache.invalidate(id)
		l.s.statusChanged(id, "heartbeating", api.HostStale, string(signal.HeartbeatStale), cids[id])
	}
}

// heardAfter is when this replica last heard from id, if that is after
// cutoff; otherwise zero. A heartbeat that came while the sweep's flush
// was writing is in memory but not yet in the store, whose last-seen time
// MarkStale reads: with thousands of hosts the flush takes long enough
// for many to arrive so. MarkStale then leaves such a host as it is, with
// no failure, audit record or status change, and stores the newer time.
func (l *liveness) heardAfter(id string, cutoff time.Time) time.Time {
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.hosts[id]; e != nil && e.seen.After(cutoff) {
		return e.seen
	}
	return time.Time{}
}

// statusRecord is the audit record of a host status transition, under the
// correlation id of what caused it, for the store to write with the
// transition itself: a crash cannot keep one without the other, and a
// later transition's record cannot come before it.
func (s *Room) statusRecord(ctx context.Context, id string, from, to api.HostStatus, reason, cid string) store.AuditEvent {
	return s.audit.Event(ctx, audit.Entry{Actor: "system", Action: "host.status", Target: id, CID: cid,
		Result: string(to), Detail: "from=" + string(from) + " reason=" + reason})
}

// auditStatus is UpdateHostAudited's audit for a change made for reason
// under cid: the status transition's record, if the status changed.
func (s *Room) auditStatus(ctx context.Context, reason, cid string) func(before, after store.Host) []store.AuditEvent {
	return func(before, after store.Host) []store.AuditEvent {
		if before.Status == after.Status {
			return nil
		}
		return []store.AuditEvent{s.statusRecord(ctx, after.ID, before.Status, after.Status, reason, cid)}
	}
}

// statusChanged logs and counts a host status transition the store has
// written, with its audit record.
func (s *Room) statusChanged(id string, from, to api.HostStatus, reason, cid string) {
	s.metrics.StatusChanges.WithLabelValues(string(to)).Inc()
	s.log.Info("host status changed", "host_id", id, "from", from, "to", to, "reason", reason, "correlation_id", cid)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
