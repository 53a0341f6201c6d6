package storetest

import (
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

var hostCases = []testCase{
	{"Host/CreateGetRoundTrip", testHostRoundTrip},
	{"Host/CreateDefaults", testHostDefaults},
	{"Host/CreateConflict", testHostConflict},
	{"Host/GetNotFound", testHostNotFound},
	{"Host/TimestampsUTC", testHostTimestampsUTC},
	{"Host/List", testHostList},
	{"Host/States", testHostStates},
	{"Host/StatesSince", testHostStatesSince},
	{"Host/Update", testHostUpdate},
	{"Host/UpdateFnError", testHostUpdateFnError},
	{"Host/UpdateNotFound", testHostUpdateNotFound},
	{"Host/UpdateConcurrent", testHostUpdateConcurrent},
	{"Host/UpdateEvent", testHostUpdateEvent},
	{"Host/TouchHosts", testTouchHosts},
	{"Host/TouchHostsNeverLowers", testTouchHostsNeverLowers},
	{"Host/MarkStale", testMarkStale},
	{"Host/MarkStaleNeverRevoked", testMarkStaleNeverRevoked},
	{"Host/FailureProfileUpdate", testHostFailureProfileUpdate},
	{"Host/LivenessConcurrent", testLivenessConcurrent},
}

func fullHost(id string) store.Host {
	return store.Host{
		ID:             id,
		OSFamily:       api.OSDragonfly,
		Labels:         map[string]string{"rack": "r1", "zone": "eu-1"},
		Enabled:        true,
		Revoked:        true,
		Draining:       true,
		Status:         api.HostAuthFailed,
		StatusReason:   "bad cert",
		Hostname:       "node1.example",
		SelectedAccel:  "cuda",
		AgentVersion:   "1.2.3",
		Capabilities:   json.RawMessage(`{"hostname":"node1.example","cpu_cores":8}`),
		Capacity:       json.RawMessage(`{"vcpus":8,"memory_mib":1024,"disk_gib":10,"gpus":1}`),
		TokenHash:      "ab12",
		TokenExpiresAt: at(time.Hour),
		TokenUsed:      true,
		CertSerial:     "0a0b",
		CertNotAfter:   at(24 * time.Hour),
		EnrolledAt:     at(time.Minute),
		LastSeenAt:     at(2 * time.Minute),
		CreatedAt:      base,
		UpdatedAt:      at(3 * time.Minute),
		LastFailure: store.Failure{Signal: "node_agent_api_unreachable", Detail: "dial tcp: refused",
			CorrelationID: "cid-1", At: at(4 * time.Minute)},
		LastSuccessfulPreflightAt: at(5 * time.Minute),
		Profile:                   store.Profile{APIURL: "https://cp:8443", TerminalURL: "https://term:8443"},
		Health: store.Health{State: api.HealthUnhealthy, Summary: "kvm: kvm_missing", CheckedAt: at(6 * time.Minute),
			TaskID: "tsk_probe"},
	}
}

func testHostRoundTrip(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for _, h := range []store.Host{fullHost("h-full"), newHost("h-min")} {
		createHost(t, s, h)
		got, err := s.GetHost(ctx, h.ID)
		must(t, err)
		diff(t, "host "+h.ID, got, h)
	}
}

func testHostDefaults(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	before := time.Now().Add(-time.Second)
	must(t, s.CreateHost(ctx, store.Host{ID: "h1", Labels: map[string]string{}}))
	got, err := s.GetHost(ctx, "h1")
	must(t, err)
	if got.Status != api.HostUnknown {
		t.Errorf("Status = %q, want unknown", got.Status)
	}
	if got.CreatedAt.Before(before) || got.CreatedAt.Location() != time.UTC {
		t.Errorf("CreatedAt = %v, want now in UTC", got.CreatedAt)
	}
	if !got.UpdatedAt.Equal(got.CreatedAt) {
		t.Errorf("UpdatedAt = %v, want CreatedAt %v", got.UpdatedAt, got.CreatedAt)
	}
	if got.Labels != nil || got.Capabilities != nil || got.Capacity != nil {
		t.Errorf("empty labels/json read back as %v %q %q, want nil", got.Labels, got.Capabilities, got.Capacity)
	}
	for name, v := range map[string]time.Time{"TokenExpiresAt": got.TokenExpiresAt, "LastSeenAt": got.LastSeenAt,
		"EnrolledAt": got.EnrolledAt, "CertNotAfter": got.CertNotAfter} {
		if !v.IsZero() {
			t.Errorf("%s = %v, want zero", name, v)
		}
	}
}

func testHostConflict(t *testing.T, s store.Store) {
	createHost(t, s, newHost("h1"))
	wantErr(t, s.CreateHost(ctxT(t), newHost("h1")), store.ErrConflict)
}

func testHostNotFound(t *testing.T, s store.Store) {
	_, err := s.GetHost(ctxT(t), "nope")
	wantErr(t, err, store.ErrNotFound)
}

func testHostTimestampsUTC(t *testing.T, s store.Store) {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	local := time.Date(2025, 3, 1, 17, 30, 0, 123456789, zone)
	h := newHost("h1")
	h.LastSeenAt, h.EnrolledAt, h.CreatedAt = local, local, local
	createHost(t, s, h)
	got, err := s.GetHost(ctxT(t), "h1")
	must(t, err)
	want := local.Truncate(time.Millisecond).UTC()
	for name, v := range map[string]time.Time{"LastSeenAt": got.LastSeenAt, "EnrolledAt": got.EnrolledAt, "CreatedAt": got.CreatedAt} {
		if !v.Equal(want) || v.Location() != time.UTC || v != want {
			t.Errorf("%s = %v (%v), want %v UTC", name, v, v.Location(), want)
		}
	}
}

func testHostList(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	hs, err := s.ListHosts(ctx)
	must(t, err)
	if len(hs) != 0 {
		t.Fatalf("empty store lists %d hosts", len(hs))
	}
	for _, id := range []string{"c", "a", "b"} {
		createHost(t, s, newHost(id))
	}
	hs, err = s.ListHosts(ctx)
	must(t, err)
	diff(t, "ids", ids(hs, func(h store.Host) string { return h.ID }), []string{"a", "b", "c"})
}

// testHostStates: GetHostState, ListHostStates and ListHostLiveness read
// the same fields as GetHost, for every host, in id order; an unknown id
// is ErrNotFound.
func testHostStates(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	states, err := s.ListHostStates(ctx)
	must(t, err)
	if len(states) != 0 {
		t.Fatalf("empty store lists %d host states", len(states))
	}
	_, err = s.GetHostState(ctx, "nope")
	wantErr(t, err, store.ErrNotFound)
	hosts := []store.Host{fullHost("h-full"), newHost("h-min"), fullHost("a-full")}
	hosts[2].Revoked, hosts[2].Enabled, hosts[2].Capacity = false, false, nil
	for _, h := range hosts {
		createHost(t, s, h)
	}
	states, err = s.ListHostStates(ctx)
	must(t, err)
	diff(t, "ids", ids(states, func(h store.HostState) string { return h.ID }), []string{"a-full", "h-full", "h-min"})
	for _, got := range states {
		h, err := s.GetHost(ctx, got.ID)
		must(t, err)
		diff(t, "listed state of "+got.ID, got, h.State())
		one, err := s.GetHostState(ctx, got.ID)
		must(t, err)
		diff(t, "state of "+got.ID, one, h.State())
	}
	live, err := s.ListHostLiveness(ctx)
	must(t, err)
	diff(t, "liveness ids", ids(live, func(h store.HostLiveness) string { return h.ID }), []string{"a-full", "h-full", "h-min"})
	for _, got := range live {
		h, err := s.GetHost(ctx, got.ID)
		must(t, err)
		diff(t, "liveness of "+got.ID, got, h.Liveness())
	}
}

// testHostStatesSince: ListHostStatesSince lists the hosts whose record
// changed at or after since, in id order, as GetHostState reads them:
// a write, a revival by heartbeat and a stale mark are changes; a
// heartbeat's last-seen time alone is not.
func testHostStatesSince(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	edge := newHost("edge")
	edge.UpdatedAt = at(2 * time.Minute)
	createHost(t, s, edge)
	for _, h := range []store.Host{hostWith("heard", api.HostHealthy, at(time.Minute)),
		hostWith("silent", api.HostHealthy, at(time.Minute)), hostWith("stale", api.HostStale, at(time.Minute)),
		newHost("edited")} {
		h.UpdatedAt = at(time.Minute)
		createHost(t, s, h)
	}
	since := func(from time.Time, want ...string) {
		t.Helper()
		states, err := s.ListHostStatesSince(ctx, from)
		must(t, err)
		if got := ids(states, func(h store.HostState) string { return h.ID }); len(got)+len(want) > 0 {
			diff(t, "ids since "+from.String(), got, want)
		}
		for _, got := range states {
			one, err := s.GetHostState(ctx, got.ID)
			must(t, err)
			diff(t, "listed state of "+got.ID, got, one)
		}
	}
	since(at(2*time.Minute), "edge")
	since(at(2 * time.Minute).Add(time.Millisecond))

	revived, err := s.TouchHosts(ctx, []store.Seen{{HostID: "heard", At: at(5 * time.Minute)},
		{HostID: "stale", At: at(5 * time.Minute)}}, nil)
	must(t, err)
	diff(t, "revived", revived, []string{"stale"})
	marked, err := s.MarkStale(ctx, at(3*time.Minute), nil)
	must(t, err)
	diff(t, "marked stale", marked, []string{"silent"})
	_, err = s.UpdateHost(ctx, "edited", func(h *store.Host) error { h.Enabled = false; return nil })
	must(t, err)
	since(at(2*time.Minute), "edge", "edited", "silent", "stale")
}

func testHostUpdate(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	got, err := s.UpdateHost(ctx, "h1", func(h *store.Host) error {
		h.ID = "ignored"
		h.Enabled = false
		h.Revoked = true
		h.Labels = map[string]string{"k": "v"}
		h.CertSerial = "99"
		h.CertNotAfter = at(time.Hour)
		return nil
	})
	must(t, err)
	if got.ID != "h1" || got.Enabled || !got.Revoked || got.CertSerial != "99" || got.Labels["k"] != "v" {
		t.Fatalf("UpdateHost returned %+v", got)
	}
	if !got.UpdatedAt.After(base) {
		t.Errorf("UpdatedAt = %v, want set to now", got.UpdatedAt)
	}
	stored, err := s.GetHost(ctx, "h1")
	must(t, err)
	diff(t, "stored host", stored, got)
	if _, err := s.GetHost(ctx, "ignored"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fn renamed the host: %v", err)
	}

	// An explicit UpdatedAt is kept.
	got, err = s.UpdateHost(ctx, "h1", func(h *store.Host) error { h.UpdatedAt = at(time.Minute); return nil })
	must(t, err)
	if !got.UpdatedAt.Equal(at(time.Minute)) {
		t.Errorf("UpdatedAt = %v, want %v", got.UpdatedAt, at(time.Minute))
	}
}

func testHostUpdateFnError(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	boom := errors.New("boom")
	_, err := s.UpdateHost(ctx, "h1", func(h *store.Host) error {
		h.Enabled = false
		return boom
	})
	if err != boom && !errors.Is(err, boom) {
		t.Fatalf("err = %v, want fn's error", err)
	}
	got, err := s.GetHost(ctx, "h1")
	must(t, err)
	diff(t, "host after failed update", got, newHost("h1"))
}

func testHostUpdateNotFound(t *testing.T, s store.Store) {
	called := false
	_, err := s.UpdateHost(ctxT(t), "nope", func(*store.Host) error { called = true; return nil })
	wantErr(t, err, store.ErrNotFound)
	if called {
		t.Error("fn called for a missing host")
	}
}

// testHostUpdateConcurrent checks the row lock: concurrent read-modify-write
// cycles must not lose updates.
func testHostUpdateConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	const workers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				_, err := s.UpdateHost(ctx, "h1", func(h *store.Host) error {
					n, _ := strconv.Atoi(h.Labels["n"])
					h.Labels = map[string]string{"n": strconv.Itoa(n + 1)}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := s.GetHost(ctx, "h1")
	must(t, err)
	if got.Labels["n"] != strconv.Itoa(workers*each) {
		t.Fatalf("counter = %s, want %d (lost updates)", got.Labels["n"], workers*each)
	}
}

func testHostUpdateEvent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	ch := subscribe(t, s)
	_, err := s.UpdateHost(ctx, "h1", func(h *store.Host) error { h.Revoked = true; return nil })
	must(t, err)
	waitEvent(t, ch, store.Event{Kind: store.EventHost, ID: "h1"})

	// A failed update publishes nothing.
	_, _ = s.UpdateHost(ctx, "h1", func(*store.Host) error { return errors.New("no") })
	noEvent(t, ch, store.Event{Kind: store.EventHost, ID: "h1"}, 200*time.Millisecond)
}

func hostWith(id string, status api.HostStatus, lastSeen time.Time) store.Host {
	h := newHost(id)
	h.Status, h.LastSeenAt = status, lastSeen
	return h
}

func testTouchHosts(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, hostWith("unknown", api.HostUnknown, time.Time{}))
	createHost(t, s, hostWith("stale", api.HostStale, at(time.Minute)))
	createHost(t, s, hostWith("healthy", api.HostHealthy, at(time.Minute)))
	createHost(t, s, hostWith("authfail", api.HostAuthFailed, at(time.Minute)))

	revived, err := s.TouchHosts(ctx, nil, nil)
	must(t, err)
	if len(revived) != 0 {
		t.Fatalf("TouchHosts(nil) = %v", revived)
	}
	seen := []store.Seen{
		{HostID: "stale", At: at(5 * time.Minute)},
		{HostID: "unknown", At: at(4 * time.Minute)},
		{HostID: "unknown", At: at(6 * time.Minute)}, // newest of a batch wins
		{HostID: "healthy", At: at(5 * time.Minute)},
		{HostID: "authfail", At: at(5 * time.Minute)},
		{HostID: "missing", At: at(5 * time.Minute)},
	}
	revived, err = s.TouchHosts(ctx, seen, nil)
	must(t, err)
	diff(t, "revived", revived, []string{"stale", "unknown"})

	want := map[string]struct {
		status api.HostStatus
		seen   time.Time
	}{
		"unknown":  {api.HostHealthy, at(6 * time.Minute)},
		"stale":    {api.HostHealthy, at(5 * time.Minute)},
		"healthy":  {api.HostHealthy, at(5 * time.Minute)},
		"authfail": {api.HostAuthFailed, at(5 * time.Minute)},
	}
	for id, w := range want {
		h, err := s.GetHost(ctx, id)
		must(t, err)
		if h.Status != w.status || !h.LastSeenAt.Equal(w.seen) {
			t.Errorf("%s: status %s last seen %v, want %s %v", id, h.Status, h.LastSeenAt, w.status, w.seen)
		}
	}
	// Already healthy: nothing revived.
	revived, err = s.TouchHosts(ctx, []store.Seen{{HostID: "stale", At: at(7 * time.Minute)}}, nil)
	must(t, err)
	if len(revived) != 0 {
		t.Fatalf("second touch revived %v", revived)
	}
	// Touching does not publish host events (liveness is not a record change),
	// and a batch of many hosts works.
	var many []store.Seen
	for i := range 300 {
		id := nth("bulk", i)
		createHost(t, s, hostWith(id, api.HostStale, at(time.Minute)))
		many = append(many, store.Seen{HostID: id, At: at(8 * time.Minute)})
	}
	revived, err = s.TouchHosts(ctx, many, nil)
	must(t, err)
	if len(revived) != 300 {
		t.Fatalf("bulk touch revived %d hosts, want 300", len(revived))
	}
}

func testTouchHostsNeverLowers(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, hostWith("h1", api.HostStale, at(10*time.Minute)))
	revived, err := s.TouchHosts(ctx, []store.Seen{{HostID: "h1", At: at(time.Minute)}}, nil)
	must(t, err)
	// An old observation still proves the agent is alive: the host revives,
	// but last_seen stays at its newer value.
	diff(t, "revived", revived, []string{"h1"})
	h, err := s.GetHost(ctx, "h1")
	must(t, err)
	if !h.LastSeenAt.Equal(at(10*time.Minute)) || h.Status != api.HostHealthy {
		t.Fatalf("host = %s %v, want healthy, last seen %v", h.Status, h.LastSeenAt, at(10*time.Minute))
	}
}

func testMarkStale(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	cutoff := at(10 * time.Minute)
	createHost(t, s, hostWith("old", api.HostHealthy, at(time.Minute)))
	createHost(t, s, hostWith("old2", api.HostHealthy, at(9*time.Minute)))
	createHost(t, s, hostWith("fresh", api.HostHealthy, at(11*time.Minute)))
	createHost(t, s, hostWith("edge", api.HostHealthy, cutoff))
	createHost(t, s, hostWith("never", api.HostHealthy, time.Time{}))
	createHost(t, s, hostWith("authfail", api.HostAuthFailed, at(time.Minute)))
	createHost(t, s, hostWith("stale", api.HostStale, at(time.Minute)))

	got, err := s.MarkStale(ctx, cutoff, nil)
	must(t, err)
	diff(t, "marked", got, []string{"old", "old2"})
	for id, want := range map[string]api.HostStatus{"old": api.HostStale, "old2": api.HostStale, "fresh": api.HostHealthy,
		"edge": api.HostHealthy, "never": api.HostHealthy, "authfail": api.HostAuthFailed} {
		h, err := s.GetHost(ctx, id)
		must(t, err)
		if h.Status != want {
			t.Errorf("%s: status %s, want %s", id, h.Status, want)
		}
	}
	got, err = s.MarkStale(ctx, cutoff, nil)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("second MarkStale = %v, want none", got)
	}
}

// testLivenessConcurrent runs heartbeat batches (in different orders) and
// stale sweeps at once, as several replicas do; none may fail (e.g. as a
// deadlock victim) and last_seen ends at the newest observation.
func testLivenessConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	const hosts, workers, rounds = 50, 6, 10
	for i := range hosts {
		createHost(t, s, hostWith(nth("h", i), api.HostHealthy, at(time.Minute)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				var seen []store.Seen
				for i := range hosts {
					j := i
					if w%2 == 1 {
						j = hosts - 1 - i
					}
					seen = append(seen, store.Seen{HostID: nth("h", j), At: at(time.Duration(2+r) * time.Minute)})
				}
				if _, err := s.TouchHosts(ctx, seen, nil); err != nil {
					errs <- err
					return
				}
			}
		})
		wg.Go(func() {
			for r := range rounds {
				if _, err := s.MarkStale(ctx, at(time.Duration(2+r)*time.Minute), nil); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	hs, err := s.ListHosts(ctx)
	must(t, err)
	for _, h := range hs {
		if !h.LastSeenAt.Equal(at(time.Duration(1+rounds) * time.Minute)) {
			t.Fatalf("%s last seen %v, want %v", h.ID, h.LastSeenAt, at(time.Duration(1+rounds)*time.Minute))
		}
	}
}
