package agent_test

// The agent diagnoses itself: every failed control plane request becomes a
// signal of internal/wire/signal, reported with heartbeats (the first one
// after an outage names it, the next one is clean), in /healthz and in
// diag.collect.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/agent/statedir"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestHeartbeatFailuresClassified: the control plane answers heartbeats
// 2 and 3 with an error; the first heartbeat that gets through afterwards
// reports the classified signal with its detail and since when, and the
// one after it is clean.
func TestHeartbeatFailuresClassified(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		sig    signal.Name
		detail string
	}{
		{http.StatusForbidden, signal.AuthFailed, "identity revoked"},
		{http.StatusNotFound, signal.BinaryInvalid, "protocol: 127.0.0.1:"},
		{http.StatusTooManyRequests, signal.EdgeRateLimited, "rate_limited: 127.0.0.1:"},
		{http.StatusServiceUnavailable, signal.APIUnreachable, "server: 127.0.0.1:"},
	} {
		t.Run(string(tc.sig), func(t *testing.T) {
			t.Parallel()
			f := newFakeCP(t)
			f.setHeartbeatStatus(func(n int) int {
				if n == 2 || n == 3 {
					return tc.status
				}
				return 0
			})
			startAgent(t, f, t.TempDir(), (&counter{}).handlers())
			var after []heartbeatPost
			eventually(t, "two heartbeats accepted after the failures", func() bool {
				after = nil
				for _, hb := range f.heartbeatLog()[min(3, len(f.heartbeatLog())):] {
					if hb.Status == http.StatusOK {
						after = append(after, hb)
					}
				}
				return len(after) >= 2
			})
			hbs := f.heartbeatLog()
			first := after[0].HB
			if first.Diagnostic != string(tc.sig) || !strings.Contains(first.DiagnosticDetail, tc.detail) ||
				!strings.HasPrefix(first.DiagnosticDetail, "heartbeat: ") && tc.sig != signal.AuthFailed {
				t.Errorf("first heartbeat after the outage: diagnostic %q detail %q; want %s with %q",
					first.Diagnostic, first.DiagnosticDetail, tc.sig, tc.detail)
			}
			if first.DiagnosticSince == nil || first.DiagnosticSince.After(hbs[2].At) {
				t.Errorf("diagnostic since %v, want at the first failure (%v)", first.DiagnosticSince, hbs[1].At)
			}
			if next := after[1].HB; next.Diagnostic != "" || next.DiagnosticDetail != "" || next.DiagnosticSince != nil {
				t.Errorf("the heartbeat after the report still carries %q %q", next.Diagnostic, next.DiagnosticDetail)
			}
		})
	}
}

// TestStatusDuringOutage: while heartbeats fail, /healthz answers 503
// with the signal, its detail and since when.
func TestStatusDuringOutage(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	r := startAgent(t, f, t.TempDir(), (&counter{}).handlers())
	// One heartbeat first: an agent never heard from is stale, not degraded.
	eventually(t, "a first heartbeat", func() bool {
		st, _ := r.Status()
		return st.LastHeartbeatAt != nil
	})
	f.setHeartbeatStatus(func(int) int { return http.StatusForbidden })
	addr, err := r.LocalAddr(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var st agent.Status
	var code int
	eventually(t, "healthz reporting auth_failed", func() bool {
		code, st = getStatus(t, "http://"+addr.String()+"/healthz")
		return st.Signal == signal.AuthFailed
	})
	if code != http.StatusServiceUnavailable || st.Status != "degraded" || st.Since == nil ||
		!strings.Contains(st.Detail, "identity revoked") || st.Diagnostic != string(signal.AuthFailed) {
		t.Errorf("healthz %d %+v", code, st)
	}
}

func getStatus(t *testing.T, url string) (int, agent.Status) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st agent.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, st
}

// TestDiskPressure: with a threshold the real filesystem exceeds (1%),
// heartbeats report disk pressure, /healthz is 503, and the agent frees
// its own buffers.
func TestDiskPressure(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	cfg := testConfig(f, t.TempDir())
	cfg.DiskPressurePercent = 1
	r := startAgentConfig(t, f, cfg, (&counter{}).handlers())
	eventually(t, "a heartbeat reporting disk pressure", func() bool {
		for _, hb := range f.heartbeatLog() {
			if hb.HB.Diagnostic == string(signal.DiskPressure) && strings.Contains(hb.HB.DiagnosticDetail, "threshold 1%") {
				return true
			}
		}
		return false
	})
	// The fake logs the heartbeat when it arrives; the agent records it
	// when the answer comes back, so its status follows a moment later.
	var st agent.Status
	var ok bool
	eventually(t, "the agent's status degraded by disk pressure", func() bool {
		st, ok = r.Status()
		return st.Status == "degraded"
	})
	if ok || st.Signal != signal.DiskPressure || st.DiskUsedPercent <= 1 || st.DiskPressurePercent != 1 {
		t.Errorf("status %+v ok %v", st, ok)
	}
	out := collect(t, r, task.CollectParams{})
	if !strings.Contains(strings.Join(out.Log, "\n"), "disk pressure: dropped the older half") {
		t.Errorf("no log line about freeing buffers: %v", out.Log)
	}
}

// TestResultSpoolReported: while result posts fail the status names
// node_task_result_post_failed and how many results are spooled.
func TestResultSpoolReported(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	f.setFailResults(0, true)
	r := startAgent(t, f, t.TempDir(), (&counter{}).handlers())
	c := claims("task-unposted", testTaskType)
	f.enqueue(deliveryFor(c, sign(t, f.signer, c)))
	var st agent.Status
	eventually(t, "status naming the spooled result", func() bool {
		st, _ = r.Status()
		return st.SpooledResults == 1 && st.Signal == signal.TaskResultPostFailed
	})
	if !strings.Contains(st.Detail, "1 results spooled") || st.CorrelationID != c.CorrelationID {
		t.Errorf("status %+v", st)
	}
	f.setFailResults(0, false)
	eventually(t, "the spool drained and the problem cleared", func() bool {
		st, _ = r.Status()
		return st.SpooledResults == 0 && st.Signal == ""
	})
}

// TestClaimFailureReported: a task whose envelope the agent refuses makes
// node_task_claim_failed the agent's problem (status and heartbeat); the
// next task that verifies clears it.
func TestClaimFailureReported(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	r := startAgent(t, f, t.TempDir(), (&counter{}).handlers())
	bad := claims("task-bad-sig", testTaskType)
	f.enqueue(deliveryFor(bad, flipPayloadChar(t, sign(t, f.signer, bad))))
	var st agent.Status
	eventually(t, "status naming the refused task", func() bool {
		st, _ = r.Status()
		return st.Signal == signal.TaskClaimFailed
	})
	if !strings.Contains(st.Detail, "task-bad-sig") || !strings.Contains(st.Detail, "envelope_bad_signature") || st.CorrelationID != bad.CorrelationID {
		t.Errorf("status %+v", st)
	}
	eventually(t, "a heartbeat reporting node_task_claim_failed", func() bool {
		for _, hb := range f.heartbeatLog() {
			if hb.HB.Diagnostic == string(signal.TaskClaimFailed) {
				return true
			}
		}
		return false
	})
	good := claims("task-good", testTaskType)
	f.enqueue(deliveryFor(good, sign(t, f.signer, good)))
	f.waitAccepted(t, good.TaskID, 1)
	eventually(t, "the problem cleared", func() bool {
		st, _ = r.Status()
		return st.Signal == ""
	})
}

func collect(t *testing.T, r *runningAgent, p task.CollectParams) task.CollectOutput {
	t.Helper()
	params, _ := json.Marshal(p)
	out, err := r.CollectHandler().Run(context.Background(), agent.Task{ID: "t-collect", Type: task.TypeCollect, Params: params})
	if err != nil {
		t.Fatalf("diag.collect: %v", err)
	}
	raw, _ := json.Marshal(out.Output)
	var co task.CollectOutput
	if err := json.Unmarshal(raw, &co); err != nil {
		t.Fatal(err)
	}
	return co
}

// TestCollect: diag.collect returns the status, events and log lines,
// within MaxBytes, and no credential of the agent.
func TestCollect(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	f.setHeartbeatStatus(func(n int) int {
		if n == 2 {
			return http.StatusTooManyRequests
		}
		return 0
	})
	dir := t.TempDir()
	r := startAgent(t, f, dir, (&counter{}).handlers())
	eventually(t, "the rate limit seen and cleared", func() bool {
		for _, ev := range collect(t, r, task.CollectParams{}).Events {
			if ev.Cleared && ev.Signal == string(signal.EdgeRateLimited) {
				return true
			}
		}
		return false
	})
	out := collect(t, r, task.CollectParams{MaxBytes: task.DefaultCollectBytes})
	var st agent.Status
	if err := json.Unmarshal(out.Status, &st); err != nil || st.NodeID != testNodeID {
		t.Errorf("status %s: %v", out.Status, err)
	}
	if out.NodeID != testNodeID || len(out.Log) == 0 || out.Truncated {
		t.Errorf("output: node %q, %d lines, truncated %v", out.NodeID, len(out.Log), out.Truncated)
	}
	raw, _ := json.Marshal(out)
	for _, secret := range []string{testToken, "PRIVATE KEY", readIdentityKey(t, dir)} {
		if secret != "" && strings.Contains(string(raw), secret) {
			t.Errorf("diag.collect output contains a credential (%.30q)", secret)
		}
	}
	small := collect(t, r, task.CollectParams{MaxBytes: 600})
	size := 0
	for _, l := range small.Log {
		size += len(l)
	}
	for _, ev := range small.Events {
		b, _ := json.Marshal(ev)
		size += len(b)
	}
	if !small.Truncated || size > 600 {
		t.Errorf("MaxBytes 600: %d bytes, truncated %v", size, small.Truncated)
	}
	if len(small.Log) > 0 && small.Log[len(small.Log)-1] != out.Log[len(out.Log)-1] && len(out.Log) > 0 {
		// Newer lines may have arrived between the two calls; the kept
		// ones must still be the newest of the smaller call.
		t.Logf("newest line differs between calls (agent kept logging)")
	}
	if _, err := r.CollectHandler().Run(context.Background(), agent.Task{Params: json.RawMessage(`{"max_bytes":-1}`)}); err == nil {
		t.Error("invalid params accepted")
	}
}

// readIdentityKey returns the node's private key PEM as stored.
func readIdentityKey(t *testing.T, dir string) string {
	t.Helper()
	d, err := statedir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	id, ok, err := d.LoadIdentity()
	if err != nil || !ok {
		t.Fatalf("identity: %v %v", ok, err)
	}
	return string(id.KeyPEM)
}
