package healthsched

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/hosts"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// clock is a fake clock the tests advance.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakeStore is the hosts (live ones heartbeat at every read), the claimed
// slots (a compare-and-set, as the store's) and the unfinished probes.
type fakeStore struct {
	clk *clock

	mu      sync.Mutex
	hosts   []store.Host
	live    map[string]bool // LastSeenAt follows the clock
	claimed map[string]time.Time
	busy    map[string]bool
}

func newFakeStore(clk *clock) *fakeStore {
	return &fakeStore{clk: clk, live: map[string]bool{}, claimed: map[string]time.Time{}, busy: map[string]bool{}}
}

func (f *fakeStore) add(h store.Host, live bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.Status == "" {
		h.Status = api.HostHealthy
	}
	f.hosts, f.live[h.ID] = append(f.hosts, h), live
}

func (f *fakeStore) ListHostLiveness(context.Context) ([]store.HostLiveness, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]store.HostLiveness, 0, len(f.hosts))
	for _, h := range f.hosts {
		if f.live[h.ID] {
			h.LastSeenAt = f.clk.Now()
		}
		out = append(out, h.Liveness())
	}
	return out, nil
}

func (f *fakeStore) ClaimHealthProbe(_ context.Context, id string, slot time.Time) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.claimed[id].Before(slot) {
		return false, nil
	}
	f.claimed[id] = slot
	return true, nil
}

func (f *fakeStore) ListTasks(_ context.Context, flt store.TaskFilter) ([]store.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if flt.Type == task.TypeHealthProbe && flt.State == api.TaskQueued && f.busy[flt.NodeID] {
		return []store.Task{{NodeID: flt.NodeID, Type: flt.Type, State: api.TaskQueued}}, nil
	}
	return nil, nil
}

// fakeTasks records what is queued, and when.
type fakeTasks struct {
	clk *clock

	mu     sync.Mutex
	queued []store.Task
}

func (f *fakeTasks) NewTask(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task {
	now := f.clk.Now()
	return store.Task{ID: httpapi.NewID("tsk_"), NodeID: nodeID, Type: typ, Params: params, State: api.TaskQueued,
		CreatedBy: httpapi.Actor(ctx), CreatedAt: now, ExpiresAt: now.Add(ttl)}
}

func (f *fakeTasks) Enqueue(_ context.Context, t store.Task) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queued = append(f.queued, t)
	return nil
}

func (f *fakeTasks) byHost() map[string][]store.Task {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]store.Task{}
	for _, t := range f.queued {
		out[t.NodeID] = append(out[t.NodeID], t)
	}
	return out
}

type fakeHosts struct {
	mu  sync.Mutex
	got []hosts.HealthOutcome
}

func (f *fakeHosts) RecordHealth(_ context.Context, o hosts.HealthOutcome) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, o)
	return nil
}

const (
	testInterval = 10 * time.Minute
	testTick     = 30 * time.Second
	testHB       = 5 * time.Second
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newSched(clk *clock, st Store, tk Tasks, interval time.Duration) *Scheduler {
	return New(Config{Interval: interval, HeartbeatInterval: testHB, Tick: testTick, Log: quiet(), Now: clk.Now},
		st, tk, &fakeHosts{})
}

func start() *clock { return &clock{now: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)} }

// run ticks every testTick for d, calling each scheduler on every tick.
func run(clk *clock, d time.Duration, ss ...*Scheduler) {
	for end := clk.Now().Add(d); clk.Now().Before(end); clk.add(testTick) {
		for _, s := range ss {
			s.Tick(context.Background())
		}
	}
}

func TestOncePerIntervalPerHostSpreadBySlot(t *testing.T) {
	clk := start()
	st, tk := newFakeStore(clk), &fakeTasks{clk: clk}
	const n = 40
	for i := range n {
		st.add(store.Host{ID: fmt.Sprintf("host-%02d", i), Enabled: true}, true)
	}
	s := newSched(clk, st, tk, testInterval)
	run(clk, lateTicks*testTick, s) // slots just missed at start are taken late: not what is measured
	tk.queued = nil
	run(clk, 3*testInterval, s)

	byHost := tk.byHost()
	ticks := map[time.Time]int{}
	for i := range n {
		id := fmt.Sprintf("host-%02d", i)
		ts := byHost[id]
		if len(ts) != 3 {
			t.Fatalf("%s probed %d times in 3 intervals, want 3", id, len(ts))
		}
		slot := s.slot(id, ts[0].CreatedAt)
		for j, tsk := range ts {
			if j > 0 && tsk.CreatedAt.Sub(ts[j-1].CreatedAt) != testInterval {
				t.Errorf("%s: probes %s apart, want %s", id, tsk.CreatedAt.Sub(ts[j-1].CreatedAt), testInterval)
			}
			if late := tsk.CreatedAt.Sub(slot.Add(time.Duration(j) * testInterval)); late < 0 || late >= testTick {
				t.Errorf("%s: probe %d queued %s after its slot", id, j, late)
			}
			if tsk.CreatedBy != Actor || tsk.CorrelationID == "" || tsk.Type != task.TypeHealthProbe {
				t.Errorf("%s: task %+v", id, tsk)
			}
			if j == 0 {
				ticks[tsk.CreatedAt]++
			}
		}
	}
	// 40 hosts in 20 ticks an interval: spread, never all at once.
	if len(ticks) < 8 {
		t.Errorf("probes fell on %d distinct ticks of the interval, want them spread", len(ticks))
	}
	for at, c := range ticks {
		if c > n/4 {
			t.Errorf("%d of %d hosts probed at once (%s)", c, n, at)
		}
	}
}

func TestSkipsIneligibleAndBusyHosts(t *testing.T) {
	clk := start()
	st, tk := newFakeStore(clk), &fakeTasks{clk: clk}
	st.add(store.Host{ID: "ok", Enabled: true}, true)
	st.add(store.Host{ID: "disabled", Enabled: false}, true)
	st.add(store.Host{ID: "revoked", Enabled: true, Revoked: true, Status: api.HostAuthFailed}, true)
	st.add(store.Host{ID: "stale-status", Enabled: true, Status: api.HostStale}, true)
	st.add(store.Host{ID: "silent", Enabled: true, LastSeenAt: clk.Now().Add(-time.Hour)}, false)
	st.add(store.Host{ID: "never", Enabled: true, Status: api.HostUnknown}, false)
	st.add(store.Host{ID: "busy", Enabled: true}, true)
	st.busy["busy"] = true
	s := newSched(clk, st, tk, testInterval)
	run(clk, 2*testInterval, s)
	byHost := tk.byHost()
	if len(byHost["ok"]) == 0 {
		t.Fatal("the eligible host was never probed")
	}
	for _, id := range []string{"disabled", "revoked", "stale-status", "silent", "never", "busy"} {
		if len(byHost[id]) != 0 {
			t.Errorf("%s probed %d times", id, len(byHost[id]))
		}
	}
	// Once its probe finished, the busy host is probed in its next slot.
	st.mu.Lock()
	st.busy["busy"] = false
	st.mu.Unlock()
	run(clk, testInterval+testTick, s)
	if got := len(tk.byHost()["busy"]); got != 1 {
		t.Errorf("busy host probed %d times after its probe finished, want 1", got)
	}
}

func TestReplicasScheduleAHostOncePerSlot(t *testing.T) {
	clk := start()
	st, tk := newFakeStore(clk), &fakeTasks{clk: clk}
	for i := range 10 {
		st.add(store.Host{ID: fmt.Sprintf("h%d", i), Enabled: true}, true)
	}
	a, b := newSched(clk, st, tk, testInterval), newSched(clk, st, tk, testInterval)
	run(clk, 2*testInterval, a, b)
	for id, ts := range tk.byHost() {
		seen := map[time.Time]bool{}
		for _, tsk := range ts {
			slot := a.slot(id, tsk.CreatedAt)
			if seen[slot] {
				t.Errorf("%s: slot %s queued twice", id, slot)
			}
			seen[slot] = true
		}
	}
	if len(tk.byHost()) != 10 {
		t.Errorf("%d hosts probed, want 10", len(tk.byHost()))
	}
}

func TestRestartDoesNotProbeTheFleetAtOnce(t *testing.T) {
	clk := start()
	st, tk := newFakeStore(clk), &fakeTasks{clk: clk}
	for i := range 100 {
		st.add(store.Host{ID: fmt.Sprintf("h%03d", i), Enabled: true}, true)
	}
	s := newSched(clk, st, tk, testInterval)
	if q := s.Tick(context.Background()); len(q) > 100*lateTicks/20+5 {
		t.Errorf("first tick queued %d of 100 hosts", len(q))
	}
}

func TestZeroIntervalDisables(t *testing.T) {
	clk := start()
	st, tk := newFakeStore(clk), &fakeTasks{clk: clk}
	st.add(store.Host{ID: "h", Enabled: true}, true)
	s := newSched(clk, st, tk, 0)
	if s.Enabled() {
		t.Fatal("enabled with interval 0")
	}
	run(clk, time.Hour, s)
	done := make(chan struct{})
	go func() { s.Run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return with interval 0")
	}
	if len(tk.byHost()) != 0 {
		t.Fatalf("queued %v with interval 0", tk.byHost())
	}
}

func TestSlotsAreStableAndWithinTheInterval(t *testing.T) {
	s := newSched(start(), nil, nil, testInterval)
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, id := range []string{"a", "b", "gpu-01"} {
		sl := s.slot(id, now)
		if sl.After(now) || now.Sub(sl) >= testInterval || sl.Nanosecond()%int(time.Millisecond) != 0 {
			t.Errorf("slot(%s) = %s at %s", id, sl, now)
		}
		if got := s.slot(id, sl); !got.Equal(sl) {
			t.Errorf("slot(%s) at its own start = %s, want %s", id, got, sl)
		}
		if got := s.slot(id, sl.Add(testInterval-time.Millisecond)); !got.Equal(sl) {
			t.Errorf("slot(%s) just before the next = %s", id, got)
		}
		if got := s.slot(id, sl.Add(testInterval)); !got.Equal(sl.Add(testInterval)) {
			t.Errorf("next slot(%s) = %s", id, got)
		}
	}
}

func finished(state api.TaskState, res *api.TaskResult) taskbus.Finished {
	t := store.Task{ID: "tsk_1", NodeID: "h1", Type: task.TypeHealthProbe, State: state, CorrelationID: "cid_1",
		FinishedAt: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
	return taskbus.Finished{Task: t, Result: res}
}

func TestOutcome(t *testing.T) {
	out := func(s string) *api.TaskResult { return &api.TaskResult{Output: json.RawMessage(s)} }
	cases := []struct {
		name    string
		e       taskbus.Finished
		health  api.HostHealth
		summary string
		ok      bool
	}{
		{"healthy", finished(api.TaskSucceeded, out(`{"healthy":true,"checks":[{"name":"kernel","ok":true},{"name":"kvm","ok":true}]}`)),
			api.HealthHealthy, "2/2 checks ok", true},
		{"unhealthy", finished(api.TaskSucceeded, out(`{"healthy":false,"checks":[{"name":"kernel","ok":true},
			{"name":"kvm","ok":false,"reason":"kvm_missing","detail":"no /dev/kvm"},{"name":"root_fs","ok":false,"reason":"disk_full"}]}`)),
			api.HealthUnhealthy, "kvm: kvm_missing (no /dev/kvm); root_fs: disk_full", true},
		{"no report", finished(api.TaskSucceeded, out(`{}`)), api.HealthUnknown, "diag.health_probe succeeded without a health report", true},
		{"failed", finished(api.TaskFailed, &api.TaskResult{Error: &api.ResultError{Code: "timeout", Message: "30s"}}),
			api.HealthUnknown, "diag.health_probe failed: timeout: 30s", true},
		{"expired", finished(api.TaskExpired, nil), api.HealthUnknown, "diag.health_probe expired without a result", true},
		{"canceled", finished(api.TaskCanceled, nil), "", "", false},
	}
	for _, tc := range cases {
		o, ok := Outcome(tc.e)
		if ok != tc.ok || o.Health != tc.health || o.Summary != tc.summary {
			t.Errorf("%s: %v %q %q, want %v %q %q", tc.name, ok, o.Health, o.Summary, tc.ok, tc.health, tc.summary)
		}
		if ok && (o.HostID != "h1" || o.TaskID != "tsk_1" || o.CorrelationID != "cid_1" || o.At.IsZero()) {
			t.Errorf("%s: outcome %+v", tc.name, o)
		}
	}
}

func TestSubscribeRecordsFinishedProbes(t *testing.T) {
	clk := start()
	fh := &fakeHosts{}
	s := New(Config{Log: quiet(), Now: clk.Now}, nil, nil, fh)
	b := taskbus.New()
	s.Subscribe(b)
	e := finished(api.TaskSucceeded, &api.TaskResult{Output: json.RawMessage(`{"healthy":true,"checks":[]}`)})
	b.PublishFinished(context.Background(), e)
	b.PublishFinished(context.Background(), finished(api.TaskCanceled, nil))
	if len(fh.got) != 1 || fh.got[0].Health != api.HealthHealthy || fh.got[0].HostID != "h1" {
		t.Fatalf("recorded %+v", fh.got)
	}
}
