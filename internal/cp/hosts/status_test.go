package hosts

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

func TestObserveHeartbeat(t *testing.T) {
	now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		diag       string
		status     api.HostStatus
		failureSig signal.Name
	}{
		{"", api.HostHealthy, ""},
		{string(signal.APIUnreachable), api.HostAPIUnreachable, signal.APIUnreachable},
		{string(signal.APITLSFailed), api.HostAPIUnreachable, signal.APITLSFailed},
		{string(signal.EdgeRateLimited), api.HostAPIUnreachable, signal.EdgeRateLimited},
		{string(signal.TaskResultPostFailed), api.HostTaskResultFailed, signal.TaskResultPostFailed},
		{legacyResultPostFailed, api.HostTaskResultFailed, signal.TaskResultPostFailed},
		{string(signal.AuthFailed), api.HostAuthFailed, signal.AuthFailed},
		{string(signal.DiskPressure), api.HostHealthy, signal.DiskPressure}, // no status: recorded only
		{"not_a_signal", api.HostHealthy, ""},
	} {
		o := observe(api.Heartbeat{Diagnostic: tc.diag, DiagnosticDetail: "seen", CorrelationID: "cid-agent"}, "cid-req", now)
		if o.status != tc.status || o.failure.Signal != string(tc.failureSig) {
			t.Errorf("%q: status %s failure %q, want %s %q", tc.diag, o.status, o.failure.Signal, tc.status, tc.failureSig)
		}
		if tc.failureSig != "" && (o.failure.CorrelationID != "cid-agent" || o.failure.Detail != "seen" || !o.failure.At.Equal(now)) {
			t.Errorf("%q: failure %+v", tc.diag, o.failure)
		}
	}
	o := observe(api.Heartbeat{Diagnostic: string(signal.APIUnreachable)}, "cid-req", now)
	if o.failure.CorrelationID != "cid-req" {
		t.Fatalf("cid %q, want the request's", o.failure.CorrelationID)
	}
	if !o.newFailure(hostState{}) || o.newFailure(hostState{failure: o.failure}) {
		t.Fatal("newFailure")
	}
	// The same problem without an agent id on the next heartbeat (another
	// request id) is not a new failure: no store write per heartbeat.
	next := observe(api.Heartbeat{Diagnostic: string(signal.APIUnreachable)}, "cid-req-2", now)
	if next.newFailure(hostState{failure: o.failure}) {
		t.Fatal("a repeated problem without an agent correlation id counted as a new failure")
	}
	// A new id from the agent is a new failure (a new occurrence).
	a1 := observe(api.Heartbeat{Diagnostic: string(signal.APIUnreachable), CorrelationID: "cid-a1"}, "r1", now)
	a2 := observe(api.Heartbeat{Diagnostic: string(signal.APIUnreachable), CorrelationID: "cid-a2"}, "r2", now)
	if !a2.newFailure(hostState{failure: a1.failure}) || a1.newFailure(hostState{failure: a1.failure}) {
		t.Fatal("an agent correlation id change must be a new failure, the same one not")
	}
}

func TestCheckProfile(t *testing.T) {
	now := time.Now().UTC()
	h := store.Host{Profile: store.Profile{APIURL: "https://cp:8443", TerminalURL: "https://term:8443"}}
	if c := checkProfile(&h, "https://cp:8443/", "https://TERM:8443", "c1", now); c != "" || h.LastFailure.Signal != "" {
		t.Fatalf("match: %q %+v", c, h.LastFailure)
	}
	if c := checkProfile(&h, "https://cp:8443", "https://wrong:8443", "c2", now); c != "drift" ||
		h.LastFailure.Signal != string(signal.EnvProfileDrift) || h.LastFailure.CorrelationID != "c2" {
		t.Fatalf("drift: %q %+v", c, h.LastFailure)
	}
	if c := checkProfile(&h, "https://cp:8443", "https://wrong:8443", "c3", now); c != "" || h.LastFailure.CorrelationID != "c2" {
		t.Fatalf("same drift again: %q %+v", c, h.LastFailure)
	}
	if c := checkProfile(&h, "", "https://term:8443", "c4", now); c != "cleared" || h.LastFailure.Signal != "" {
		t.Fatalf("cleared: %q %+v", c, h.LastFailure)
	}
	// Another failure is never cleared by a matching profile.
	h.LastFailure = store.Failure{Signal: string(signal.APIUnreachable)}
	if c := checkProfile(&h, "", "https://term:8443", "c5", now); c != "" || h.LastFailure.Signal != string(signal.APIUnreachable) {
		t.Fatalf("other failure: %q %+v", c, h.LastFailure)
	}
}

func TestPreflightFailureKeepsFirstOccurrence(t *testing.T) {
	first := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	now := first.Add(3 * time.Second)
	auth := string(signal.AuthFailed)
	o := PreflightOutcome{NodeAPIFailed: true, Signal: auth, Detail: "403 node_identity_superseded", CorrelationID: "pfl_2"}
	failing := store.Host{Status: api.HostAuthFailed, LastSuccessfulPreflightAt: first.Add(-time.Minute),
		LastFailure: store.Failure{Signal: auth, Detail: "node_identity_superseded", CorrelationID: "cid_1", At: first}}
	for _, tc := range []struct {
		name string
		edit func(h *store.Host)
		at   time.Time
	}{
		{"same signal persists: the first occurrence's time", func(*store.Host) {}, first},
		{"another signal", func(h *store.Host) { h.LastFailure.Signal = string(signal.HeartbeatStale) }, now},
		{"the host is healthy again", func(h *store.Host) { h.Status = api.HostHealthy }, now},
		{"a run passed since", func(h *store.Host) { h.LastSuccessfulPreflightAt = first.Add(time.Second) }, now},
		{"no earlier failure", func(h *store.Host) { h.LastFailure = store.Failure{} }, now},
	} {
		h := failing
		tc.edit(&h)
		f := preflightFailure(h, o, now)
		if !f.At.Equal(tc.at) || f.Signal != auth || f.CorrelationID != "pfl_2" || f.Detail != o.Detail {
			t.Errorf("%s: %+v, want at %s with the run's signal, detail and correlation id", tc.name, f, tc.at)
		}
	}
}
