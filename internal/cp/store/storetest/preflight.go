package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

var preflightCases = []testCase{
	{"Preflight/RoundTrip", testPreflightRoundTrip},
	{"Preflight/ConflictNotFound", testPreflightConflictNotFound},
	{"Preflight/ListFilters", testPreflightList},
}

func preflightRun(id, host, cid string, created time.Duration, ok bool) store.PreflightRun {
	r := store.PreflightRun{ID: id, HostID: host, CorrelationID: cid, OK: ok,
		Report:    json.RawMessage(`{"schema":"drover.preflight/v1","correlation_id":"` + cid + `"}`),
		CreatedBy: "operator:ops", CreatedAt: at(created)}
	if !ok {
		r.FailedHop, r.Signal = "node_runtime_api_reachability", "node_agent_api_unreachable"
	}
	return r
}

func testPreflightRoundTrip(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for _, r := range []store.PreflightRun{preflightRun("pf-1", "h1", "cid-1", 0, false),
		{ID: "pf-min", CreatedAt: base}} {
		must(t, s.CreatePreflightRun(ctx, r))
		got, err := s.GetPreflightRun(ctx, r.ID)
		must(t, err)
		diff(t, "run "+r.ID, got, r)
	}
}

func testPreflightConflictNotFound(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	must(t, s.CreatePreflightRun(ctx, preflightRun("pf-1", "h1", "c", 0, true)))
	wantErr(t, s.CreatePreflightRun(ctx, preflightRun("pf-1", "h2", "c", 0, true)), store.ErrConflict)
	_, err := s.GetPreflightRun(ctx, "pf-none")
	wantErr(t, err, store.ErrNotFound)
}

func testPreflightList(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for _, r := range []store.PreflightRun{preflightRun("pf-a", "h1", "c1", time.Minute, true),
		preflightRun("pf-b", "h1", "c2", 2*time.Minute, false), preflightRun("pf-c", "h2", "c1", 3*time.Minute, true)} {
		must(t, s.CreatePreflightRun(ctx, r))
	}
	ids := func(f store.PreflightFilter) []string {
		rs, err := s.ListPreflightRuns(ctx, f)
		must(t, err)
		var out []string
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	diff(t, "all", ids(store.PreflightFilter{}), []string{"pf-c", "pf-b", "pf-a"})
	diff(t, "host", ids(store.PreflightFilter{HostID: "h1"}), []string{"pf-b", "pf-a"})
	diff(t, "cid", ids(store.PreflightFilter{CorrelationID: "c1"}), []string{"pf-c", "pf-a"})
	diff(t, "both", ids(store.PreflightFilter{HostID: "h2", CorrelationID: "c1"}), []string{"pf-c"})
	diff(t, "limit", ids(store.PreflightFilter{Limit: 1}), []string{"pf-c"})
}

// testMarkStaleNeverRevoked: a revoked host whose heartbeats stopped keeps
// its status (auth_failed); it never drifts to stale, even if its status
// was left healthy. An api_unreachable host a preflight run named stays so;
// one its agent reported goes stale.
func testMarkStaleNeverRevoked(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	h := hostWith("revoked", api.HostHealthy, at(time.Minute))
	h.Revoked = true
	createHost(t, s, h)
	held := hostWith("preflight", api.HostAPIUnreachable, at(time.Minute))
	held.StatusReason = store.PreflightStatusReasonPrefix + "node_runtime_api_reachability"
	createHost(t, s, held)
	agent := hostWith("agent", api.HostAPIUnreachable, at(time.Minute))
	agent.StatusReason = "edge_rate_limited"
	createHost(t, s, agent)
	got, err := s.MarkStale(ctx, at(10*time.Minute), nil)
	must(t, err)
	diff(t, "marked", got, []string{"agent"})
	h2, err := s.GetHost(ctx, "revoked")
	must(t, err)
	if h2.Status != api.HostHealthy {
		t.Fatalf("status %s", h2.Status)
	}
}

// testHostFailureProfileUpdate: the last failure, the profile and the last
// successful preflight are written by UpdateHost and cleared again.
func testHostFailureProfileUpdate(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	f := store.Failure{Signal: "terminal_env_profile_drift", Detail: "terminal url", CorrelationID: "cid-9", At: at(time.Minute)}
	p := store.Profile{APIURL: "https://a:8443", TerminalURL: "https://t:8443"}
	h, err := s.UpdateHost(ctx, "h1", func(h *store.Host) error {
		h.LastFailure, h.Profile, h.LastSuccessfulPreflightAt = f, p, at(2*time.Minute)
		return nil
	})
	must(t, err)
	got, err := s.GetHost(ctx, "h1")
	must(t, err)
	diff(t, "updated", got, h)
	diff(t, "failure", got.LastFailure, f)
	diff(t, "profile", got.Profile, p)
	if !got.LastSuccessfulPreflightAt.Equal(at(2 * time.Minute)) {
		t.Fatalf("last preflight %v", got.LastSuccessfulPreflightAt)
	}
	_, err = s.UpdateHost(ctx, "h1", func(h *store.Host) error {
		h.LastFailure = store.Failure{}
		return nil
	})
	must(t, err)
	got, err = s.GetHost(ctx, "h1")
	must(t, err)
	diff(t, "cleared", got.LastFailure, store.Failure{})
}
