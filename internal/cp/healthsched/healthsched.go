// Package healthsched runs diag.health_probe periodically on every host and
// applies every finished probe to its host's health. It is a room of its
// own because the hosts room must not queue tasks: the scheduler reads the
// host records, queues the probe through the tasks room, and hands each
// finished probe (scheduled or run by an operator) to the hosts room
// (hosts.Room.RecordHealth), which owns the host record, its audit and its
// change events.
//
// Each host probes once per Interval, in a slot of its own: the slots are
// aligned to the Unix epoch and offset by a hash of the host id, so a large
// fleet is spread over the interval and every replica computes the same
// slots. A replica claims a host's slot in the store
// (store.HostStore.ClaimHealthProbe, a compare-and-set on the host record)
// before it queues the probe, so with several replicas on one database
// exactly one schedules a host per interval. A host is scheduled only when
// enabled, not revoked and heartbeating, and only when no diag.health_probe
// of it is queued, dispatched or running (a slow host never piles up
// probes). A slot found more than a few ticks late (the replica was down,
// the host just came back) is skipped: restarts do not probe the whole
// fleet at once.
package healthsched

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/hosts"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/periodic"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Actor is the created_by of the probes the scheduler queues.
const Actor = "system:health-probe"

// Store is what the scheduler reads and claims. store.Store satisfies it.
type Store interface {
	ListHostLiveness(ctx context.Context) ([]store.HostLiveness, error)
	ClaimHealthProbe(ctx context.Context, id string, slot time.Time) (bool, error)
	ListTasks(ctx context.Context, f store.TaskFilter) ([]store.Task, error)
}

// Tasks queues tasks (tasks.Room).
type Tasks interface {
	NewTask(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task
	Enqueue(ctx context.Context, t store.Task) error
}

// Hosts records a finished probe on its host (hosts.Room).
type Hosts interface {
	RecordHealth(ctx context.Context, o hosts.HealthOutcome) error
}

// Config configures the scheduler.
type Config struct {
	// Interval is how often each host is probed; 0 (or less) disables the
	// scheduling (finished probes still update the hosts).
	Interval time.Duration
	// HeartbeatInterval is the control plane's: a host not seen for
	// staleAfter of them is not probed.
	HeartbeatInterval time.Duration
	// Tick is how often the scheduler looks for due hosts (default
	// Interval/20, between 100 ms and 15 s).
	Tick time.Duration
	Log  *slog.Logger
	Now  func() time.Time
}

// staleAfter is how many heartbeat intervals without one make a host too
// stale to probe (one more than the hosts room's stale sweep allows).
const staleAfter = 4

// lateTicks is how many ticks after its slot a host may still be probed in
// it.
const lateTicks = 3

// Scheduler is this replica's health probe scheduler.
type Scheduler struct {
	cfg   Config
	store Store
	tasks Tasks
	hosts Hosts
	log   *slog.Logger

	mu sync.Mutex
	// handled is, per host, the last slot this replica has dealt with
	// (probed, lost to another replica, skipped as busy or late).
	handled map[string]time.Time
}

// New is the scheduler; Run starts it.
func New(cfg Config, st Store, tasks Tasks, h Hosts) *Scheduler {
	cfg.Interval = cfg.Interval.Truncate(time.Millisecond) // slots are stored in milliseconds
	if cfg.Tick <= 0 {
		cfg.Tick = min(max(cfg.Interval/20, 100*time.Millisecond), 15*time.Second)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Scheduler{cfg: cfg, store: st, tasks: tasks, hosts: h, log: cfg.Log, handled: map[string]time.Time{}}
}

// Enabled reports whether the scheduler probes at all.
func (s *Scheduler) Enabled() bool { return s.cfg.Interval > 0 }

// Run schedules probes every Tick until ctx ends; it returns at once when
// the scheduler is disabled.
func (s *Scheduler) Run(ctx context.Context) {
	if !s.Enabled() {
		return
	}
	s.log.Info("health probe scheduler started", "interval", s.cfg.Interval, "tick", s.cfg.Tick)
	periodic.Run(ctx, s.cfg.Tick, s.log, "health probe tick", func(ctx context.Context) error {
		s.Tick(ctx)
		return nil
	})
}

// slot is the start of host id's current slot at now: the latest time not
// after now that is offset(id) past a multiple of Interval since the epoch.
func (s *Scheduler) slot(id string, now time.Time) time.Time {
	iv := s.cfg.Interval.Milliseconds()
	h := fnv.New64a()
	h.Write([]byte(id))
	off := int64(h.Sum64() % uint64(iv))
	n := now.UnixMilli() - off
	k := n / iv
	if n < 0 && n%iv != 0 {
		k--
	}
	return time.UnixMilli(k*iv + off).UTC()
}

// eligible reports whether h may be probed at now: enabled, not revoked,
// heartbeating and seen recently.
func (s *Scheduler) eligible(h store.HostLiveness, now time.Time) bool {
	if !h.Enabled || h.Revoked || h.LastSeenAt.IsZero() {
		return false
	}
	switch h.Status {
	case api.HostStale, api.HostUnknown, api.HostAuthFailed, "":
		return false
	}
	return now.Sub(h.LastSeenAt) <= staleAfter*s.cfg.HeartbeatInterval
}

// busy reports whether a diag.health_probe of host id is not finished.
func (s *Scheduler) busy(ctx context.Context, id string) (bool, error) {
	for _, st := range []api.TaskState{api.TaskQueued, api.TaskDispatched, api.TaskRunning} {
		ts, err := s.store.ListTasks(ctx, store.TaskFilter{NodeID: id, Type: task.TypeHealthProbe, State: st, Limit: 1})
		if err != nil {
			return false, err
		}
		if len(ts) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// Tick queues a probe for every eligible host whose slot has come and
// that this replica has not handled yet; it returns the ids queued.
func (s *Scheduler) Tick(ctx context.Context) []string {
	if !s.Enabled() {
		return nil
	}
	// The narrowest listing: at 20,000 hosts the full records
	// (capabilities included) would be hundreds of MB read every tick, and
	// the host cache's state (capacity and last failure included) ≈ 48 MB
	// and 60 ms of CPU (BenchmarkHostCache).
	hs, err := s.store.ListHostLiveness(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("health probe scheduler: list hosts", "err", err)
		}
		return nil
	}
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string]bool, len(hs))
	var queued []string
	for _, h := range hs {
		seen[h.ID] = true
		slot := s.slot(h.ID, now)
		if last, ok := s.handled[h.ID]; ok && !slot.After(last) {
			continue
		}
		if now.Sub(slot) > lateTicks*s.cfg.Tick { // missed: wait for the next one
			s.handled[h.ID] = slot
			continue
		}
		if !s.eligible(h, now) {
			continue // it may become eligible while the slot is still fresh
		}
		if s.schedule(ctx, h.ID, slot) {
			queued = append(queued, h.ID)
		}
	}
	for id := range s.handled {
		if !seen[id] {
			delete(s.handled, id)
		}
	}
	return queued
}

// schedule claims host id's slot and queues its probe; it reports whether
// it queued one. A store error leaves the slot to the next tick.
func (s *Scheduler) schedule(ctx context.Context, id string, slot time.Time) bool {
	log := s.log.With("host_id", id, "slot", slot)
	busy, err := s.busy(ctx, id)
	if err != nil {
		log.Warn("health probe scheduler: list the host's probes", "err", err)
		return false
	}
	if busy {
		s.handled[id] = slot
		log.Debug("health probe skipped: the previous one is not finished")
		return false
	}
	ok, err := s.store.ClaimHealthProbe(ctx, id, slot)
	if err != nil {
		log.Warn("health probe scheduler: claim", "err", err)
		return false
	}
	s.handled[id] = slot
	if !ok { // another replica has it
		return false
	}
	params, _ := json.Marshal(task.HealthProbeParams{})
	cid := httpapi.NewID("cid_")
	t := s.tasks.NewTask(httpapi.WithActor(ctx, Actor), id, task.TypeHealthProbe, params,
		max(s.cfg.Interval, 2*task.HealthProbeTimeout))
	t.CorrelationID = cid
	if err := s.tasks.Enqueue(ctx, t); err != nil {
		log.Warn("health probe scheduler: enqueue", "err", err, "correlation_id", cid)
		return false
	}
	log.Debug("health probe queued", "task_id", t.ID, "correlation_id", cid)
	return true
}
