package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// auditByCID returns the audit records under a correlation id.
func (e *env) auditByCID(cid string) []api.AuditEvent {
	e.t.Helper()
	var out []api.AuditEvent
	if st := e.op(http.MethodGet, "/api/v1/audit?correlation_id="+cid, nil, &out); st != http.StatusOK {
		e.t.Fatalf("audit: HTTP %d", st)
	}
	return out
}

func (e *env) host(id string) api.Host {
	e.t.Helper()
	var h api.Host
	if st := e.op(http.MethodGet, "/api/v1/hosts/"+id, nil, &h); st != http.StatusOK {
		e.t.Fatalf("show host %s: HTTP %d", id, st)
	}
	return h
}

// TestRevokedHostStaysAuthFailed: a revoked host shows auth_failed at once,
// with the revocation as its last failure, and never drifts to stale after
// its heartbeats stop (it used to go stale).
func TestRevokedHostStaysAuthFailed(t *testing.T) {
	e := startEnv(t, openSQLite(t), fastLiveness)
	n := e.enroll("node-rv", e.createHost("node-rv").Token)
	if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-rv", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", st, body)
	}
	e.waitHostStatus("node-rv", api.HostHealthy, 2*time.Second)
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-rv/revoke", nil, nil); st != http.StatusOK {
		t.Fatalf("revoke: %d", st)
	}
	h := e.waitHostStatus("node-rv", api.HostAuthFailed, 2*time.Second)
	if h.LastFailureSignal != string(signal.AuthFailed) || h.LastFailureCorrelationID == "" || h.LastFailureAt == nil {
		t.Fatalf("last failure after revoke: %+v", h)
	}
	time.Sleep(1500 * time.Millisecond) // > 3 intervals of 200ms: a heartbeating host would be stale
	if h := e.host("node-rv"); h.Status != api.HostAuthFailed {
		t.Fatalf("revoked host drifted to %s", h.Status)
	}
	var found bool
	for _, a := range e.auditByCID(h.LastFailureCorrelationID) {
		found = found || (a.Action == "host.status" && a.Result == string(api.HostAuthFailed))
	}
	if !found {
		t.Fatal("auth_failed transition not audited with the revocation's correlation id")
	}
}

// TestAgentReportedSignals: a signal the agent reports in its heartbeat
// gives the host the signal's status and last failure (with the agent's
// correlation id, audited); a clean heartbeat makes it healthy again.
func TestAgentReportedSignals(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := e.enroll("node-sig", e.createHost("node-sig").Token)
	beat := func(hb api.Heartbeat) {
		if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-sig", "/heartbeat"), hb); st != http.StatusOK {
			t.Fatalf("heartbeat: %d %s", st, body)
		}
	}
	for i, tc := range []struct {
		sig  signal.Name
		want api.HostStatus
	}{
		{signal.APIUnreachable, api.HostAPIUnreachable},
		{signal.EdgeRateLimited, api.HostAPIUnreachable},
		{signal.TaskResultPostFailed, api.HostTaskResultFailed},
	} {
		cid := "cid-agent-" + string(rune('a'+i))
		beat(api.Heartbeat{Diagnostic: string(tc.sig), DiagnosticDetail: "seen by the agent", CorrelationID: cid})
		h := e.waitHostStatus("node-sig", tc.want, 2*time.Second)
		if h.LastFailureSignal != string(tc.sig) || h.LastFailureCorrelationID != cid || h.LastFailureDetail != "seen by the agent" {
			t.Fatalf("%s: host %+v", tc.sig, h)
		}
		var audited bool
		for _, a := range e.auditByCID(cid) {
			audited = audited || (a.Action == "host.status" && a.Result == string(tc.want))
		}
		if !audited {
			t.Fatalf("%s: transition to %s not audited under %s", tc.sig, tc.want, cid)
		}
		beat(api.Heartbeat{})
		if h := e.waitHostStatus("node-sig", api.HostHealthy, 2*time.Second); h.LastFailureSignal != string(tc.sig) {
			t.Fatalf("last failure lost on recovery: %+v", h)
		}
	}
}

// TestHostProfileDrift: an agent whose terminal URL differs from its host's
// profile shows terminal_env_profile_drift as its last failure (its status
// stays as heartbeats make it); fixing the profile clears it.
func TestHostProfileDrift(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	var bt api.BootstrapToken
	if st := e.op(http.MethodPost, "/api/v1/hosts", api.CreateHostRequest{HostID: "node-pd", OSFamily: "linux",
		APIURL: e.nodeURL, TerminalURL: "https://wrong.example:8443"}, &bt); st != http.StatusCreated {
		t.Fatalf("create host: %d", st)
	}
	e.startAgent("node-pd", bt.Token, agentOpts{})
	h := e.waitHostStatus("node-pd", api.HostHealthy, 10*time.Second)
	if h.LastFailureSignal != string(signal.EnvProfileDrift) || !strings.Contains(h.LastFailureDetail, "wrong.example") ||
		h.Profile.ReportedTerminalURL != e.nodeURL {
		t.Fatalf("drift not recorded: %+v", h)
	}
	if !e.auditHas("host.profile_drift", "node-pd", "drift") {
		t.Error("drift not audited")
	}
	var fe api.ErrorBody
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-pd/profile", api.HostProfileRequest{TerminalURL: "ftp://x"}, &fe); st != http.StatusUnprocessableEntity ||
		len(fe.Error.Fields) == 0 || fe.Error.Fields[0].Field != "terminal_url" {
		t.Fatalf("bad profile URL: %d %+v", st, fe)
	}
	h = api.Host{}
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-pd/profile", api.HostProfileRequest{APIURL: e.nodeURL,
		TerminalURL: e.nodeURL + "/"}, &h); st != http.StatusOK {
		t.Fatalf("set profile: %d", st)
	}
	if h.LastFailureSignal != "" || h.Profile.TerminalURL != e.nodeURL+"/" || h.Status != api.HostHealthy {
		t.Fatalf("drift not cleared: %+v", h)
	}
	if !e.auditHas("host.profile", "node-pd", "ok") || !e.auditHas("host.profile_drift", "node-pd", "cleared") {
		t.Error("profile change not audited")
	}
}

func passingReport(node, cid string) preflight.Report {
	now := time.Now().UTC()
	r := preflight.Report{Schema: preflight.SchemaVersion, CorrelationID: cid, NodeID: node, StartedAt: now, FinishedAt: now,
		Hops: []preflight.HopResult{{Hop: signal.HopNodeHeartbeat, Status: preflight.Passed, DurationMS: 3}}}
	r.Classify()
	return r
}

// TestPreflightRunsStored: a valid report is stored, audited with its
// correlation id, and sets the host's last successful preflight; an invalid
// one is refused with a field error naming the field; a failed node API hop
// makes a stale host api_unreachable with the run's correlation id, and it
// stays so.
func TestPreflightRunsStored(t *testing.T) {
	e := startEnv(t, openSQLite(t), fastLiveness)
	n := e.enroll("node-pf", e.createHost("node-pf").Token)
	var run api.PreflightRun
	if st := e.op(http.MethodPost, "/api/v1/preflight-runs", passingReport("node-pf", "cid-pf-ok"), &run); st != http.StatusCreated ||
		!run.OK || run.HostID != "node-pf" || run.CorrelationID != "cid-pf-ok" {
		t.Fatalf("store run: %d %+v", st, run)
	}
	if h := e.host("node-pf"); h.LastSuccessfulPreflightAt == nil {
		t.Fatalf("last successful preflight not set: %+v", h)
	}
	var runs []api.PreflightRun
	if st := e.op(http.MethodGet, "/api/v1/preflight-runs?host_id=node-pf", nil, &runs); st != http.StatusOK || len(runs) != 1 || runs[0].ID != run.ID {
		t.Fatalf("list: %d %+v", st, runs)
	}
	var got api.PreflightRun
	if st := e.op(http.MethodGet, "/api/v1/preflight-runs/"+run.ID, nil, &got); st != http.StatusOK || !bytes.Contains(got.Report, []byte(preflight.SchemaVersion)) {
		t.Fatalf("show: %d %+v", st, got)
	}
	var audited bool
	for _, a := range e.auditByCID("cid-pf-ok") {
		audited = audited || (a.Action == "preflight.run" && a.Target == "node-pf" && a.Result == "passed")
	}
	if !audited {
		t.Fatal("preflight.run not audited with the report's correlation id")
	}

	bad := passingReport("node-pf", "cid-pf-bad")
	bad.Hops = append(bad.Hops, preflight.HopResult{Hop: "not_a_hop", Status: preflight.Passed})
	var eb api.ErrorBody
	if st := e.op(http.MethodPost, "/api/v1/preflight-runs", bad, &eb); st != http.StatusUnprocessableEntity ||
		len(eb.Error.Fields) == 0 || eb.Error.Fields[0].Field != "hops[1].hop" {
		t.Fatalf("invalid report: %d %+v", st, eb)
	}
	bad = passingReport("node-pf", "cid-pf-bad")
	bad.Schema = "drover.preflight/v0"
	if st := e.op(http.MethodPost, "/api/v1/preflight-runs", bad, &eb); st != http.StatusUnprocessableEntity ||
		len(eb.Error.Fields) == 0 || eb.Error.Fields[0].Field != "schema" {
		t.Fatalf("wrong schema: %d %+v", st, eb)
	}

	// The host heartbeats once, then stops: stale; a failed node-side API
	// hop names why.
	if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-pf", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", st, body)
	}
	e.waitHostStatus("node-pf", api.HostStale, 3*time.Second)
	failed := passingReport("node-pf", "cid-pf-api")
	failed.Hops = append(failed.Hops, preflight.HopResult{Hop: signal.HopNodeRuntimeAPIReachability})
	failed.Hops[1].Fail(signal.APIUnreachable, "dial tcp 10.0.0.5:8443: connection refused")
	failed.Classify()
	if st := e.op(http.MethodPost, "/api/v1/preflight-runs", failed, &run); st != http.StatusCreated || run.OK {
		t.Fatalf("failed run: %d %+v", st, run)
	}
	h := e.waitHostStatus("node-pf", api.HostAPIUnreachable, 2*time.Second)
	if h.LastFailureCorrelationID != "cid-pf-api" || h.LastFailureSignal != string(signal.APIUnreachable) {
		t.Fatalf("host after failed run: %+v", h)
	}
	time.Sleep(1 * time.Second) // several stale sweeps
	if h := e.host("node-pf"); h.Status != api.HostAPIUnreachable {
		t.Fatalf("api_unreachable host went %s", h.Status)
	}
	if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-pf", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", st, body)
	}
	e.waitHostStatus("node-pf", api.HostHealthy, 2*time.Second)
}

// untar reads a tar.gz into a map of file name to contents.
func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("gzip: %v (%q)", err, b[:min(len(b), 200)])
	}
	tr := tar.NewReader(gz)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		out[h.Name], _ = io.ReadAll(tr)
	}
}

// TestEvidenceBundle: the bundle of a correlation id holds its task (with
// result, events and envelope metadata), its audit records, its preflight
// run and the agent's own diagnostics from a diag.collect, with a manifest.
func TestEvidenceBundle(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	e.startAgent("node-ev", e.createHost("node-ev").Token, agentOpts{})
	e.waitHostStatus("node-ev", api.HostHealthy, 10*time.Second)
	const cid = "cid-evidence-1"
	raw, _ := json.Marshal(task.EchoParams{Message: "evidence"})
	var tk api.Task
	if st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: "node-ev", Type: task.TypeEcho,
		Params: raw, CorrelationID: cid}, &tk); st != http.StatusCreated {
		t.Fatalf("enqueue: %d", st)
	}
	if got := e.waitTask(tk.ID, 30*time.Second); got.State != api.TaskSucceeded {
		t.Fatalf("echo: %s", got.State)
	}
	if st := e.op(http.MethodPost, "/api/v1/preflight-runs", passingReport("node-ev", cid), nil); st != http.StatusCreated {
		t.Fatalf("store run: %d", st)
	}
	var bundle []byte
	if st := e.op(http.MethodGet, "/api/v1/evidence/"+cid, nil, &bundle); st != http.StatusOK {
		t.Fatalf("evidence: %d %s", st, bundle)
	}
	files := untar(t, bundle)
	var m api.EvidenceManifest
	if err := json.Unmarshal(files["manifest.json"], &m); err != nil || m.CorrelationID != cid || len(m.Files) != 5 {
		t.Fatalf("manifest %s: %v", files["manifest.json"], err)
	}
	var tasks []struct {
		api.Task
		Envelope struct {
			KID      string `json:"kid"`
			IssuedAt int64  `json:"iat"`
			Expires  int64  `json:"exp"`
			Audience string `json:"aud"`
		} `json:"envelope"`
	}
	if err := json.Unmarshal(files["tasks.json"], &tasks); err != nil {
		t.Fatal(err)
	}
	var echo bool
	for _, x := range tasks {
		if x.ID == tk.ID {
			echo = x.Result != nil && x.Envelope.KID != "" && x.Envelope.Audience == "node-ev" && x.Envelope.IssuedAt > 0 && x.Envelope.Expires > 0
		}
	}
	if !echo {
		t.Fatalf("tasks.json lacks the echo task with its result and envelope: %s", files["tasks.json"])
	}
	if !bytes.Contains(files["audit.json"], []byte(`"task.enqueue"`)) || !bytes.Contains(files["audit.json"], []byte(`"preflight.run"`)) {
		t.Fatalf("audit.json: %s", files["audit.json"])
	}
	if !bytes.Contains(files["preflight.json"], []byte(`"node-ev"`)) {
		t.Fatalf("preflight.json: %s", files["preflight.json"])
	}
	if _, ok := files["terminal-sessions.json"]; !ok {
		t.Fatal("no terminal-sessions.json")
	}
	var diag api.TaskResult
	if err := json.Unmarshal(files["agent-diagnostics.json"], &diag); err != nil || diag.Status != api.ResultSucceeded {
		t.Fatalf("agent-diagnostics.json %s (missing: %v): %v", files["agent-diagnostics.json"], m.Missing, err)
	}
	var out task.CollectOutput
	if err := json.Unmarshal(diag.Output, &out); err != nil || out.NodeID != "node-ev" {
		t.Fatalf("diag.collect output %s: %v", diag.Output, err)
	}
	if len(m.Missing) != 0 {
		t.Fatalf("missing: %v", m.Missing)
	}
}

// TestEvidenceBundleRecordsMissingDiagnostics: with no agent to run
// diag.collect, the bundle is still served and its manifest says why the
// agent's diagnostics are missing.
func TestEvidenceBundleRecordsMissingDiagnostics(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.EvidenceCollectWait = time.Second })
	e.createHost("node-gone")
	const cid = "cid-evidence-2"
	if st := e.op(http.MethodPost, "/api/v1/preflight-runs", passingReport("node-gone", cid), nil); st != http.StatusCreated {
		t.Fatalf("store run: %d", st)
	}
	var bundle []byte
	if st := e.op(http.MethodGet, "/api/v1/evidence/"+cid, nil, &bundle); st != http.StatusOK {
		t.Fatalf("evidence: %d %s", st, bundle)
	}
	var m api.EvidenceManifest
	if err := json.Unmarshal(untar(t, bundle)["manifest.json"], &m); err != nil {
		t.Fatal(err)
	}
	if why := m.Missing["agent-diagnostics.json"]; !strings.Contains(why, task.TypeCollect) {
		t.Fatalf("manifest missing = %v, want the diag.collect failure", m.Missing)
	}
}
