package hosts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

const testInterval = 5 * time.Second

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }
func (c *testClock) set(t time.Time)         { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// replicas are rooms on one SQLite store, each with its own memory, as
// control-plane replicas on one database are; they share a clock.
type replicas struct {
	st    store.Store
	clock *testClock
}

func newReplicas(t *testing.T, hostIDs ...string) *replicas {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c := &testClock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	for _, id := range hostIDs {
		if err := st.CreateHost(t.Context(), store.Host{ID: id, OSFamily: api.OSLinux, Enabled: true,
			Status: api.HostUnknown, EnrolledAt: c.now, CreatedAt: c.now, UpdatedAt: c.now}); err != nil {
			t.Fatal(err)
		}
	}
	return &replicas{st: st, clock: c}
}

func (rs *replicas) room() *Room {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return New(Config{HeartbeatInterval: testInterval, Log: log, Now: rs.clock.Now}, rs.st, nil, nil, nil,
		audit.New(rs.st, rs.clock.Now, log), NewMetrics(prometheus.NewRegistry()))
}

func (rs *replicas) host(t *testing.T, id string) store.Host {
	t.Helper()
	h, err := rs.st.GetHost(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (rs *replicas) audited(t *testing.T, id, result string) int {
	t.Helper()
	evs, err := rs.st.ListAudit(t.Context(), store.AuditFilter{Action: "host.status", Target: id, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Result == result {
			n++
		}
	}
	return n
}

// beat sends one heartbeat through the handler as the authenticated node id.
func beat(t *testing.T, s *Room, id string, hb api.Heartbeat) {
	t.Helper()
	b, err := json.Marshal(hb)
	if err != nil {
		t.Fatal(err)
	}
	beatRaw(t, s, id, b, http.StatusOK)
}

func beatRaw(t *testing.T, s *Room, id string, body []byte, want int) {
	t.Helper()
	hs, err := s.cache.get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/internal/v1/nodes/"+id+"/heartbeat",
		bytes.NewReader(body))
	w := httptest.NewRecorder()
	status := http.StatusOK
	if err := s.Heartbeat(w, r, Caller{ID: id, state: hs}); err != nil {
		var he *httpapi.Error
		if !errors.As(err, &he) {
			t.Fatalf("heartbeat: %v", err)
		}
		status = he.Status
	}
	if status != want {
		t.Fatalf("heartbeat %s: status %d, want %d", body, status, want)
	}
}

func capacity(freeMiB int) *api.CapacityReport {
	return &api.CapacityReport{Total: api.Capacity{VCPUs: 4, MemoryMiB: 8192}, Free: api.Capacity{VCPUs: 4, MemoryMiB: freeMiB}}
}

// TestHeartbeatChangesWrittenAtOnce: the first heartbeat (unknown →
// healthy), a new capacity and a reported problem reach the store during
// the request, with their status events audited; no flush is needed.
func TestHeartbeatChangesWrittenAtOnce(t *testing.T) {
	rs := newReplicas(t, "n1")
	s := rs.room()
	beat(t, s, "n1", api.Heartbeat{AgentVersion: "1", Capacity: capacity(8192)})
	h := rs.host(t, "n1")
	if h.Status != api.HostHealthy || !h.LastSeenAt.Equal(rs.clock.Now()) || len(h.Capacity) == 0 {
		t.Fatalf("after first heartbeat: status %s, last seen %s, capacity %s", h.Status, h.LastSeenAt, h.Capacity)
	}
	if rs.audited(t, "n1", "healthy") != 1 {
		t.Fatal("unknown → healthy not audited")
	}

	beat(t, s, "n1", api.Heartbeat{AgentVersion: "1", Capacity: capacity(1024)})
	var got api.CapacityReport
	if err := json.Unmarshal(rs.host(t, "n1").Capacity, &got); err != nil || got != *capacity(1024) {
		t.Fatalf("capacity after change: %+v (%v)", got, err)
	}

	beat(t, s, "n1", api.Heartbeat{AgentVersion: "1", Capacity: capacity(1024),
		Diagnostic: string(signal.TaskResultPostFailed)})
	if h := rs.host(t, "n1"); h.Status != api.HostTaskResultFailed || h.LastFailure.Signal != string(signal.TaskResultPostFailed) {
		t.Fatalf("after reported problem: %s, last failure %+v", h.Status, h.LastFailure)
	}
	beat(t, s, "n1", api.Heartbeat{AgentVersion: "1", Capacity: capacity(1024)})
	if h := rs.host(t, "n1"); h.Status != api.HostHealthy || rs.audited(t, "n1", "healthy") != 2 {
		t.Fatalf("after recovery: %s", h.Status)
	}
}

// TestHeartbeatUnchangedCoalesced: an unchanged heartbeat writes nothing
// during the request; the sweep (every interval) writes its time, so the
// stored last-seen lags by at most one interval. A body that differs is
// decoded again, and an invalid one is still refused.
func TestHeartbeatUnchangedCoalesced(t *testing.T) {
	rs := newReplicas(t, "n1")
	s := rs.room()
	hb := api.Heartbeat{AgentVersion: "1", Capacity: capacity(8192)}
	beat(t, s, "n1", hb)
	first := rs.host(t, "n1")

	rs.clock.advance(testInterval)
	beat(t, s, "n1", hb)
	if h := rs.host(t, "n1"); !h.UpdatedAt.Equal(first.UpdatedAt) || !h.LastSeenAt.Equal(first.LastSeenAt) {
		t.Fatalf("unchanged heartbeat wrote the host: updated %s → %s, last seen %s → %s",
			first.UpdatedAt, h.UpdatedAt, first.LastSeenAt, h.LastSeenAt)
	}
	s.live.sweep(t.Context()) // what Run does every interval
	if h := rs.host(t, "n1"); !h.LastSeenAt.Equal(rs.clock.Now()) || h.Status != api.HostHealthy {
		t.Fatalf("after the sweep: last seen %s, want %s; status %s", h.LastSeenAt, rs.clock.Now(), h.Status)
	}

	// Same decoded value, other bytes (field order): decoded, nothing written.
	rs.clock.advance(time.Second)
	beatRaw(t, s, "n1", []byte(`{"capacity":{"total":{"vcpus":4,"memory_mib":8192,"disk_gib":0,"gpus":0},"reserved":{"vcpus":0,"memory_mib":0,"disk_gib":0,"gpus":0},"allocated":{"vcpus":0,"memory_mib":0,"disk_gib":0,"gpus":0},"free":{"vcpus":4,"memory_mib":8192,"disk_gib":0,"gpus":0}},"agent_version":"1"}`), http.StatusOK)
	beatRaw(t, s, "n1", []byte(`{"agent_version":"1","bogus":1}`), http.StatusUnprocessableEntity)
	beatRaw(t, s, "n1", []byte(`{"agent_version":`), http.StatusUnprocessableEntity)
	s.Flush(t.Context())
	if h := rs.host(t, "n1"); !h.LastSeenAt.Equal(rs.clock.Now()) {
		t.Fatalf("last seen %s, want %s", h.LastSeenAt, rs.clock.Now())
	}

	allocs := testing.AllocsPerRun(200, func() {
		s.live.beat(t.Context(), "n1", hostState{status: api.HostHealthy}, rs.clock.Now(), observation{status: api.HostHealthy})
		if _, _, ok := s.live.decoded("n1", s.live.shard("n1").hosts["n1"].sum); !ok {
			t.Fatal("last body not remembered")
		}
	})
	if allocs != 0 {
		t.Errorf("unchanged beat: %v allocations, want 0", allocs)
	}
}

// TestHeartbeatFleetCoalescedAcrossShards: the hosts of a fleet are spread
// over liveness's locks, and one flush still writes every unchanged
// heartbeat of every one of them, and a sweep drops none that was heard.
func TestHeartbeatFleetCoalescedAcrossShards(t *testing.T) {
	ids := make([]string, 4*liveShards)
	for i := range ids {
		ids[i] = fmt.Sprintf("n%03d", i)
	}
	rs := newReplicas(t, ids...)
	s := rs.room()
	hb := api.Heartbeat{AgentVersion: "1"}
	for _, id := range ids {
		beat(t, s, id, hb) // unknown → healthy: written at once
	}
	used := 0
	for i := range s.live.shards {
		if len(s.live.shards[i].hosts) > 0 {
			used++
		}
	}
	if used < liveShards/2 {
		t.Errorf("%d hosts in %d of %d shards", len(ids), used, liveShards)
	}
	rs.clock.advance(testInterval)
	for _, id := range ids {
		beat(t, s, id, hb) // unchanged: coalesced
	}
	s.live.sweep(t.Context())
	for _, id := range ids {
		if h := rs.host(t, id); !h.LastSeenAt.Equal(rs.clock.Now()) || h.Status != api.HostHealthy {
			t.Fatalf("%s after the sweep: last seen %s, want %s; status %s", id, h.LastSeenAt, rs.clock.Now(), h.Status)
		}
	}
}

// TestHeartbeatStopTurnsStale: a host that stops heartbeating turns stale
// at the first sweep more than three intervals after its last heartbeat,
// on the replica that heard it and on one that did not, and the entry it
// had in memory is dropped.
func TestHeartbeatStopTurnsStale(t *testing.T) {
	rs := newReplicas(t, "n1")
	a, b := rs.room(), rs.room()
	hb := api.Heartbeat{AgentVersion: "1"}
	beat(t, a, "n1", hb)
	for range 3 { // heartbeats every interval, swept by A each interval
		rs.clock.advance(testInterval)
		beat(t, a, "n1", hb)
		a.live.sweep(t.Context())
		b.live.sweep(t.Context())
	}
	last := rs.clock.Now()
	for _, step := range []struct {
		at    time.Duration // after the last heartbeat
		stale bool
	}{{testInterval, false}, {2 * testInterval, false}, {3 * testInterval, false}, {3*testInterval + time.Second, true}} {
		rs.clock.set(last.Add(step.at))
		b.live.sweep(t.Context()) // the other replica's sweep
		a.live.sweep(t.Context())
		if got := rs.host(t, "n1").Status == api.HostStale; got != step.stale {
			t.Fatalf("%s after the last heartbeat: stale %v, want %v", step.at, got, step.stale)
		}
	}
	if rs.audited(t, "n1", "stale") != 1 {
		t.Fatal("stale transition audited more or less than once")
	}
	if _, ok := a.live.shard("n1").hosts["n1"]; ok {
		t.Fatal("liveness entry of a host not heard from for three intervals kept")
	}
	beat(t, b, "n1", hb) // and back, written at once
	if h := rs.host(t, "n1"); h.Status != api.HostHealthy {
		t.Fatalf("after a new heartbeat: %s", h.Status)
	}
}

// TestRestartedReplicaWaitsBeforeStale: after the control plane was down
// for an hour, a replica that just started marks no host stale before it
// has been up for three intervals itself: agents reconnecting in that time
// never turn stale, and one that stays silent turns stale just after.
func TestRestartedReplicaWaitsBeforeStale(t *testing.T) {
	for _, reconnects := range []bool{false, true} {
		rs := newReplicas(t, "n1")
		a := rs.room()
		hb := api.Heartbeat{AgentVersion: "1"}
		beat(t, a, "n1", hb)
		a.Flush(t.Context())
		rs.clock.advance(time.Hour) // every replica down for an hour
		started := rs.clock.Now()
		b := rs.room()
		for _, step := range []struct {
			at    time.Duration // after b started
			stale bool
		}{{0, false}, {testInterval, false}, {2 * testInterval, false},
			{3*testInterval - time.Second, false}, {3*testInterval + time.Second, !reconnects}} {
			rs.clock.set(started.Add(step.at))
			if reconnects && step.at == 2*testInterval {
				beat(t, b, "n1", hb)
			}
			b.live.sweep(t.Context())
			if got := rs.host(t, "n1").Status == api.HostStale; got != step.stale {
				t.Fatalf("reconnects=%v, %s after the restart: stale %v, want %v", reconnects, step.at, got, step.stale)
			}
		}
	}
}

// touchHook is a store whose TouchHosts runs during first before writing:
// a heartbeat that arrives while the flush is writing.
type touchHook struct {
	store.Store
	during func()
}

func (h *touchHook) TouchHosts(ctx context.Context, seen []store.Seen, audit func(string) store.AuditEvent) ([]string, error) {
	if f := h.during; f != nil {
		h.during = nil
		f()
	}
	return h.Store.TouchHosts(ctx, seen, audit)
}

// TestHeartbeatDuringFlushNotStale: a host whose heartbeat arrives while
// the sweep's flush is writing (in memory, not yet in the store) is not
// left stale by the sweep, and no stale transition is recorded for it;
// a host that stayed silent in the same sweep turns stale.
func TestHeartbeatDuringFlushNotStale(t *testing.T) {
	rs := newReplicas(t, "n1", "n2", "n3")
	hook := &touchHook{Store: rs.st}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := New(Config{HeartbeatInterval: testInterval, Log: log, Now: rs.clock.Now}, hook, nil, nil, nil,
		audit.New(rs.st, rs.clock.Now, log), NewMetrics(prometheus.NewRegistry()))
	hb := api.Heartbeat{AgentVersion: "1"}
	for _, id := range []string{"n1", "n2", "n3"} {
		beat(t, a, id, hb)
	}
	a.Flush(t.Context())
	rs.clock.advance(3*testInterval + time.Second) // n1 and n2 silent since, as stored
	beat(t, a, "n3", hb)                           // n3 in this flush
	hook.during = func() { beat(t, a, "n1", hb) }  // n1 while it writes
	a.live.sweep(t.Context())
	for id, want := range map[string]api.HostStatus{"n1": api.HostHealthy, "n2": api.HostStale, "n3": api.HostHealthy} {
		if got := rs.host(t, id).Status; got != want {
			t.Errorf("%s: %s, want %s", id, got, want)
		}
	}
	if n := rs.audited(t, "n1", "stale"); n != 0 {
		t.Errorf("n1, heard during the flush, audited stale %d times", n)
	}
}

// TestHeartbeatReplicaCrashLosesAtMostOneInterval: replica A hears a host
// every interval and sweeps every interval, then dies without flushing.
// The store still has a last-seen at most one interval older than the
// host's last heartbeat: a host that goes silent too turns stale on
// replica B at most one interval early (after two intervals, not three),
// and a host whose agent moves to B within that time never does.
func TestHeartbeatReplicaCrashLosesAtMostOneInterval(t *testing.T) {
	for _, moves := range []bool{false, true} {
		rs := newReplicas(t, "n1")
		a, b := rs.room(), rs.room()
		hb := api.Heartbeat{AgentVersion: "1"}
		beat(t, a, "n1", hb)
		for range 4 {
			rs.clock.advance(testInterval)
			beat(t, a, "n1", hb)
			a.live.sweep(t.Context())
			b.live.sweep(t.Context())
		}
		rs.clock.advance(testInterval)
		beat(t, a, "n1", hb) // heard, then A dies before its sweep
		last := rs.clock.Now()
		if seen := rs.host(t, "n1").LastSeenAt; last.Sub(seen) > testInterval {
			t.Fatalf("stored last seen %s is more than an interval before the last heartbeat %s", seen, last)
		}
		if moves { // the agent's next heartbeats reach B
			rs.clock.set(last.Add(testInterval))
			beat(t, b, "n1", hb)
		}
		rs.clock.set(last.Add(2 * testInterval))
		b.live.sweep(t.Context())
		if rs.host(t, "n1").Status == api.HostStale {
			t.Fatalf("moves=%v: stale two intervals after the last heartbeat A heard", moves)
		}
		rs.clock.set(last.Add(2*testInterval + time.Second))
		b.live.sweep(t.Context())
		if got := rs.host(t, "n1").Status == api.HostStale; got == moves {
			t.Fatalf("moves=%v: stale %v just after two intervals", moves, got)
		}
	}
}

// auditProbe is a store that, as each status write returns, counts the
// host.status records already stored for the hosts it changed: the
// records a crash at that moment would keep.
type auditProbe struct {
	store.Store
	t      *testing.T
	stored map[string]int // "id result" -> records found at return
}

func (p *auditProbe) look(ids []string, result string) {
	for _, id := range ids {
		evs, err := p.Store.ListAudit(p.t.Context(), store.AuditFilter{Action: "host.status", Target: id})
		if err != nil {
			p.t.Fatal(err)
		}
		n := 0
		for _, e := range evs {
			if e.Result == result {
				n++
			}
		}
		p.stored[id+" "+result] = n
	}
}

func (p *auditProbe) MarkStale(ctx context.Context, cutoff time.Time, mark func(string, time.Time) store.StaleMark) ([]string, error) {
	ids, err := p.Store.MarkStale(ctx, cutoff, mark)
	p.look(ids, "stale")
	return ids, err
}

func (p *auditProbe) TouchHosts(ctx context.Context, seen []store.Seen, audit func(string) store.AuditEvent) ([]string, error) {
	ids, err := p.Store.TouchHosts(ctx, seen, audit)
	p.look(ids, "healthy")
	return ids, err
}

// TestStatusAuditedWithTransition: a host's stale status and its revival
// by a heartbeat flush are stored with their audit records, not after
// them: when the store write returns, the record is there (a crash or a
// racing reader never sees the status without it, and the stale record
// can never land after the healthy one that followed it).
func TestStatusAuditedWithTransition(t *testing.T) {
	rs := newReplicas(t, "n1")
	probe := &auditProbe{Store: rs.st, t: t, stored: map[string]int{}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := New(Config{HeartbeatInterval: testInterval, Log: log, Now: rs.clock.Now}, probe, nil, nil, nil,
		audit.New(rs.st, rs.clock.Now, log), NewMetrics(prometheus.NewRegistry()))
	b := rs.room()
	hb := api.Heartbeat{AgentVersion: "1"}
	beat(t, a, "n1", hb) // unknown -> healthy, cached on A
	rs.clock.advance(3*testInterval + time.Second)
	a.live.sweep(t.Context()) // stale, by the probed store
	beat(t, a, "n1", hb)      // A revives it at once, and caches it healthy
	rs.clock.advance(3*testInterval + time.Second)
	b.live.sweep(t.Context()) // stale again, by B, of which A has not heard yet:
	cached := rs.host(t, "n1")
	cached.Status = api.HostHealthy
	a.cache.put(cached)
	beat(t, a, "n1", hb) // A's cache says healthy,
	a.Flush(t.Context()) // and its flush revives the host
	for _, k := range []string{"n1 stale", "n1 healthy"} {
		if got := probe.stored[k]; got == 0 {
			t.Errorf("%s: no record stored when the write returned (%v)", k, probe.stored)
		}
	}
	if h := rs.host(t, "n1"); h.Status != api.HostHealthy || h.LastFailure.Signal != string(signal.HeartbeatStale) {
		t.Errorf("n1: %s, last failure %+v", h.Status, h.LastFailure)
	}
	evs, err := rs.st.ListAudit(t.Context(), store.AuditFilter{Action: "host.status", Target: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for i := len(evs) - 1; i >= 0; i-- {
		order = append(order, evs[i].Result)
	}
	if want := "healthy stale healthy stale healthy"; strings.Join(order, " ") != want {
		t.Errorf("records oldest first: %q, want %q", strings.Join(order, " "), want)
	}
}
