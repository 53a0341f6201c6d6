package preflight

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// runFake runs preflight against f with the allocation and node of the
// fake; edit changes the config first.
func runFake(t *testing.T, f *fakeAPI, edit func(*Config)) (*preflight.Report, []string, []preflight.HopResult) {
	t.Helper()
	srv := f.start()
	var warnings []string
	var progress []preflight.HopResult
	cfg := Config{APIBase: srv.URL, Token: "t", AllocationID: "alc_1", NodeID: "node-1", Timeout: 2 * time.Second,
		Warn: func(s string) { warnings = append(warnings, s) }, Progress: func(h preflight.HopResult) { progress = append(progress, h) }}
	if edit != nil {
		edit(&cfg)
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep, warnings, progress
}

func hopOf(rep *preflight.Report, h signal.Hop) preflight.HopResult {
	for _, r := range rep.Hops {
		if r.Hop == h {
			return r
		}
	}
	return preflight.HopResult{}
}

func TestHops(t *testing.T) {
	old := time.Now().Add(-time.Minute)
	cases := []struct {
		name    string
		fake    func(*fakeAPI)
		cfg     func(*testing.T, *Config)
		wantHop signal.Hop
		wantSig signal.Name
		detail  string // a substring of the failed hop's detail
	}{
		{name: "allocation not active", fake: func(f *fakeAPI) { f.alloc.State = api.AllocationProvisioning },
			wantHop: signal.HopAllocationBinding, wantSig: signal.AllocationNotReady, detail: "provisioning"},
		{name: "allocation on another host", fake: func(f *fakeAPI) { f.alloc.HostID = "node-2" },
			wantHop: signal.HopAllocationBinding, wantSig: signal.AllocationNotReady, detail: "node-2"},
		{name: "instance allocation on another host", fake: func(f *fakeAPI) {
			f.alloc.Kind, f.alloc.HostID, f.alloc.InstanceID = api.AllocationInstance, "", "inst-2"
			f.instances = map[string]string{"inst-2": "node-2"}
		}, wantHop: signal.HopAllocationBinding, wantSig: signal.AllocationNotReady, detail: "bound to host node-2"},
		{name: "smoke: no frame at all", fake: func(f *fakeAPI) { f.ws = "hang" },
			cfg:     func(_ *testing.T, c *Config) { c.RunWSSmoke, c.Timeout = true, 300*time.Millisecond },
			wantHop: signal.HopWorkloadTerminalStartup, wantSig: signal.UIConnectingStuck, detail: "no ready or error frame"},
		{name: "control plane store down: not the allocation's fault", fake: func(f *fakeAPI) { f.allocCode = http.StatusInternalServerError },
			wantHop: signal.HopAllocationBinding, wantSig: signal.ControlPlaneFailed, detail: "HTTP 500 internal"},
		{name: "mint answered 503", fake: func(f *fakeAPI) { f.mintCode = http.StatusServiceUnavailable },
			wantHop: signal.HopTerminalTokenMint, wantSig: signal.ControlPlaneFailed, detail: "HTTP 503"},
		{name: "allocation unknown", cfg: func(_ *testing.T, c *Config) { c.AllocationID = "alc_nope" },
			wantHop: signal.HopAllocationBinding, wantSig: signal.AllocationNotReady, detail: "HTTP 404"},
		{name: "host stale", fake: func(f *fakeAPI) { f.host.Status = api.HostStale },
			wantHop: signal.HopNodeHeartbeat, wantSig: signal.HeartbeatStale, detail: "stale"},
		{name: "last seen long ago", fake: func(f *fakeAPI) { f.host.LastSeenAt = &old },
			wantHop: signal.HopNodeHeartbeat, wantSig: signal.HeartbeatStale, detail: "last seen"},
		{name: "revoked host, long unheard: auth, not stale", fake: func(f *fakeAPI) {
			f.host.Revoked, f.host.Status, f.host.LastSeenAt = true, api.HostAuthFailed, &old
		}, wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.AuthFailed, detail: "revoked"},
		{name: "the host's heartbeat interval sets the window", fake: func(f *fakeAPI) {
			// last seen a minute ago is fresh at a 60 s interval; the run
			// gets past node_heartbeat to the host's result failures.
			f.host.HeartbeatInterval, f.host.LastSeenAt, f.host.Status = api.Duration(time.Minute), &old, api.HostTaskResultFailed
		}, wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.TaskResultPostFailed},
		{name: "host auth failed", fake: func(f *fakeAPI) { f.host.Status = api.HostAuthFailed },
			wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.AuthFailed},
		{name: "host task results failing", fake: func(f *fakeAPI) { f.host.Status = api.HostTaskResultFailed },
			wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.TaskResultPostFailed},
		{name: "probe never claimed", fake: func(f *fakeAPI) { f.taskEnd = api.TaskQueued },
			wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.TaskClaimFailed, detail: "not claimed"},
		{name: "probe claimed, no result", fake: func(f *fakeAPI) { f.taskEnd = api.TaskRunning },
			wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.TaskResultPostFailed, detail: "no result"},
		{name: "probe sees a full disk", fake: func(f *fakeAPI) {
			f.result = &api.TaskResult{Status: api.ResultSucceeded, Output: []byte(`{"root_fs":{"path":"/","used_percent":99.5,"full":true}}`)}
		}, wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.DiskFull, detail: "99.5%"},
		{name: "probe fails on disk pressure", fake: func(f *fakeAPI) {
			f.taskEnd = api.TaskFailed
			f.result = &api.TaskResult{Status: api.ResultFailed, Error: &api.ResultError{Code: "node_observability_disk_pressure", Message: "92% used"}}
		}, wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.DiskPressure},
		{name: "host's last health probe unhealthy", fake: func(f *fakeAPI) {
			f.host.Health, f.host.HealthSummary, f.host.HealthTaskID = api.HealthUnhealthy, "kvm: kvm_missing", "tsk_sched"
		}, wantHop: signal.HopNodeRecoveryStatus, wantSig: signal.HealthProbeUnhealthy, detail: "kvm: kvm_missing"},
		{name: "mint refused", fake: func(f *fakeAPI) { f.mintCode = http.StatusConflict },
			wantHop: signal.HopTerminalTokenMint, wantSig: signal.TokenMintFailed, detail: "allocation_inactive"},
		{name: "no healthz", fake: func(f *fakeAPI) { f.healthz = http.StatusNotFound },
			wantHop: signal.HopTerminalPublicRoute, wantSig: signal.PublicRouteMissing, detail: "HTTP 404"},
		{name: "terminal base unreachable", cfg: func(_ *testing.T, c *Config) { c.TerminalBase = "http://127.0.0.1:1" },
			wantHop: signal.HopTerminalPublicRoute, wantSig: signal.PublicRouteMissing, detail: "127.0.0.1:1"},
		{name: "gateway answers HTTP", fake: func(f *fakeAPI) { f.ws = "http" },
			wantHop: signal.HopBrowserTerminalWS, wantSig: signal.GatewayUpgradeFailed, detail: "HTTP 502"},
		{name: "gateway hangs", fake: func(f *fakeAPI) { f.ws = "hang" }, cfg: func(_ *testing.T, c *Config) { c.Timeout = 500 * time.Millisecond },
			wantHop: signal.HopBrowserTerminalWS, wantSig: signal.GatewayUpgradeFailed, detail: "no error frame"},
		{name: "smoke: pty fails", fake: func(f *fakeAPI) { f.ws = string(terminal.CodePTYFailed) }, cfg: smoke,
			wantHop: signal.HopWorkloadTerminalStartup, wantSig: signal.PTYFailed, detail: "scripted failure"},
		{name: "smoke: node offline", fake: func(f *fakeAPI) { f.ws = string(terminal.CodeNodeOffline) }, cfg: smoke,
			wantHop: signal.HopWorkloadTerminalStartup, wantSig: signal.HeartbeatStale},
		{name: "smoke: open without stream", fake: func(f *fakeAPI) {
			f.ws = "ready"
			f.session.States = f.session.States[:3]
		}, cfg: smoke, wantHop: signal.HopGatewayNodeStream, wantSig: signal.OpenWithoutStream, detail: "tsk_open"},
		{name: "node disk full", cfg: local(nodeHops(signal.HopNodeReadiness, signal.DiskFull)...),
			wantHop: signal.HopNodeReadiness, wantSig: signal.DiskFull},
		{name: "node cannot reach the API", cfg: local(nodeHops(signal.HopNodeRuntimeAPIReachability, signal.APITLSFailed)...),
			wantHop: signal.HopNodeRuntimeAPIReachability, wantSig: signal.APITLSFailed},
		{name: "node terminal URL unreachable", cfg: local(nodeHops(signal.HopNodeTerminalReachability, signal.NodeStreamTimeout)...),
			wantHop: signal.HopNodeTerminalReachability, wantSig: signal.NodeStreamTimeout},
		{name: "node dials another terminal URL than the profile", fake: func(f *fakeAPI) {
			f.host.Profile.TerminalURL = "https://term.internal:8443"
		}, cfg: local(withData(nodeHops("", ""), signal.HopNodeTerminalReachability, "url", "https://127.0.0.1:9")...),
			wantHop: signal.HopNodeTerminalReachability, wantSig: signal.EnvProfileDrift, detail: "profile says https://term.internal:8443"},
		{name: "agent binary for another architecture", cfg: func(t *testing.T, c *Config) {
			c.NodeLocal, c.AgentBinary = true, filepath.Join(t.TempDir(), "drover-agent")
			// Not an ELF file and no #!: exec fails with ENOEXEC, as a
			// binary of another architecture does.
			if err := os.WriteFile(c.AgentBinary, []byte("\x7fXYZ not an executable"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, wantHop: signal.HopNodeReadiness, wantSig: signal.BinaryInvalid, detail: "not built for this host"},
		{name: "agent refuses its configuration", cfg: func(t *testing.T, c *Config) {
			c.NodeLocal, c.AgentBinary = true, filepath.Join(t.TempDir(), "drover-agent")
			script := "#!/bin/sh\necho 'drover-agent preflight: configuration: NODE_AGENT_CONTROL_PLANE_URL (-control-plane-url) is required' >&2\nexit 2\n"
			if err := os.WriteFile(c.AgentBinary, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}, wantHop: signal.HopNodeReadiness, wantSig: signal.ProcessDown, detail: "NODE_AGENT_CONTROL_PLANE_URL"},
		{name: "agent binary missing", cfg: func(_ *testing.T, c *Config) { c.NodeLocal, c.AgentBinary = true, "/nonexistent/drover-agent" },
			wantHop: signal.HopNodeReadiness, wantSig: signal.BinaryInvalid, detail: "no JSON node report"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			if tc.fake != nil {
				tc.fake(f)
			}
			rep, _, progress := runFake(t, f, func(c *Config) {
				if tc.cfg != nil {
					tc.cfg(t, c)
				}
			})
			c := rep.Classification
			if c.OK || c.Hop != tc.wantHop || c.Signal != tc.wantSig {
				t.Fatalf("classification %+v, want %s at %s\nhops: %+v", c, tc.wantSig, tc.wantHop, rep.Hops)
			}
			got := hopOf(rep, tc.wantHop)
			if got.Owner == "" || got.Recovery == "" || !strings.Contains(got.Detail, tc.detail) {
				t.Errorf("failed hop %+v: want owner, recovery and %q in the detail", got, tc.detail)
			}
			if len(rep.Hops) != len(signal.Hops()) || len(progress) != len(rep.Hops) {
				t.Fatalf("%d hops, %d progress lines; want %d", len(rep.Hops), len(progress), len(signal.Hops()))
			}
			after := false
			for i, h := range rep.Hops {
				if h.Hop != signal.Hops()[i].Hop {
					t.Errorf("hop %d is %s, want %s", i, h.Hop, signal.Hops()[i].Hop)
				}
				if after && h.Hop != signal.HopClassification &&
					(h.Status != preflight.Skipped || h.Detail != "after failed hop "+string(tc.wantHop)) {
					t.Errorf("hop %s after the failure: %s %q", h.Hop, h.Status, h.Detail)
				}
				after = after || h.Hop == tc.wantHop
			}
			if last := rep.Hops[len(rep.Hops)-1]; last.Status != preflight.Failed || last.Signal != tc.wantSig {
				t.Errorf("final_classification %+v", last)
			}
		})
	}
}

func smoke(_ *testing.T, c *Config) { c.RunWSSmoke = true }

// withData sets key in hop's Data.
func withData(hops []preflight.HopResult, hop signal.Hop, key string, v any) []preflight.HopResult {
	for i := range hops {
		if hops[i].Hop == hop {
			hops[i].Data = map[string]any{key: v}
		}
	}
	return hops
}

// local runs the node-side hops with a fake drover-agent printing hops.
func local(hops ...preflight.HopResult) func(*testing.T, *Config) {
	return func(t *testing.T, c *Config) {
		c.NodeLocal = true
		c.AgentBinary = fakeAgent(t, hops...)
	}
}

func TestHealthyRunWithoutSmoke(t *testing.T) {
	f := newFake(t)
	agent := fakeAgent(t, nodeHops("", "")...)
	rep, warnings, _ := runFake(t, f, func(c *Config) {
		c.NodeID = "" // taken from the allocation
		c.NodeLocal, c.AgentBinary = true, agent
		c.NodeTerminalURL, c.NodeTerminalResolveAddress = "https://term.internal:8443", "10.0.0.5"
	})
	if !rep.Classification.OK || rep.Schema != preflight.SchemaVersion || rep.NodeID != "node-1" {
		t.Fatalf("report %+v", rep)
	}
	want := map[signal.Hop]preflight.Status{signal.HopNodeOpsAccess: preflight.Skipped,
		signal.HopWorkloadTerminalStartup: preflight.Skipped, signal.HopGatewayNodeStream: preflight.Skipped}
	for _, h := range rep.Hops {
		w, ok := want[h.Hop]
		if !ok {
			w = preflight.Passed
		}
		if h.Status != w {
			t.Errorf("hop %s: %s (%s), want %s", h.Hop, h.Status, h.Detail, w)
		}
	}
	if d := hopOf(rep, signal.HopBrowserTerminalWS).Detail; !strings.Contains(d, "token_invalid") || !strings.Contains(d, "4401") {
		t.Errorf("browser_terminal_ws detail %q", d)
	}
	if !slices.Contains(f.offered, terminal.TokenSubprotocolPrefix+invalidToken) || !slices.Contains(f.offered, terminal.Subprotocol) {
		t.Errorf("offered subprotocols %v", f.offered)
	}
	args, err := os.ReadFile(filepath.Join(filepath.Dir(agent), "args.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(args)); got != "preflight --json --timeout 2s --terminal-url https://term.internal:8443 --terminal-resolve-address 10.0.0.5" {
		t.Errorf("agent args %q", got)
	}
	if len(f.cids) != 1 || !f.cids[rep.CorrelationID] {
		t.Errorf("correlation ids seen %v, want only %s", f.cids, rep.CorrelationID)
	}
	if f.stored == nil || f.stored.CorrelationID != rep.CorrelationID || len(f.stored.Hops) != len(rep.Hops) {
		t.Errorf("stored %+v", f.stored)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings %v", warnings)
	}
	if slices.Contains(f.paths, "POST /api/v1/tasks/tsk_probe/cancel") {
		t.Error("a finished probe was canceled")
	}
}

func TestHealthyRunWithSmoke(t *testing.T) {
	f := newFake(t)
	f.ws = "ready"
	rep, _, _ := runFake(t, f, func(c *Config) { c.RunWSSmoke = true })
	if !rep.Classification.OK || rep.SessionID != "ses_1" {
		t.Fatalf("report %+v", rep)
	}
	for _, h := range []signal.Hop{signal.HopBrowserTerminalWS, signal.HopWorkloadTerminalStartup, signal.HopGatewayNodeStream} {
		if r := hopOf(rep, h); r.Status != preflight.Passed {
			t.Errorf("%s: %+v", h, r)
		}
	}
	if r := hopOf(rep, signal.HopNodeReadiness); r.Status != preflight.Skipped || r.Detail != noNodeSide {
		t.Errorf("node_readiness without a node: %+v", r)
	}
	if slices.Contains(f.offered, terminal.TokenSubprotocolPrefix+invalidToken) || !slices.Contains(f.offered, "drover.token.tok123") {
		t.Errorf("offered %v, want the minted token only", f.offered)
	}
}

// TestRootCauseNodeTerminal: a node_stream_timeout at startup with the
// node's own terminal path failing names node_terminal_reachability.
func TestRootCauseNodeTerminal(t *testing.T) {
	f := newFake(t)
	f.ws = string(terminal.CodeNodeStreamTimeout)
	agent := fakeAgent(t, nodeHops(signal.HopNodeTerminalReachability, signal.NodeStreamTimeout)...)
	rep, _, _ := runFake(t, f, func(c *Config) { c.RunWSSmoke, c.NodeLocal, c.AgentBinary = true, true, agent })
	if c := rep.Classification; c.Hop != signal.HopNodeTerminalReachability || c.Signal != signal.NodeStreamTimeout {
		t.Fatalf("classification %+v\nhops %+v", c, rep.Hops)
	}
	if r := hopOf(rep, signal.HopWorkloadTerminalStartup); r.Status != preflight.Failed || r.Signal != signal.NodeStreamTimeout {
		t.Errorf("startup %+v", r)
	}
	if r := hopOf(rep, signal.HopNodeTerminalReachability); r.Status != preflight.Failed {
		t.Errorf("node terminal %+v", r)
	}
	if r := hopOf(rep, signal.HopGatewayNodeStream); r.Status != preflight.Skipped {
		t.Errorf("gateway_node_stream %+v", r)
	}
	if r := hopOf(rep, signal.HopClassification); !strings.Contains(r.Detail, "node_terminal_reachability") {
		t.Errorf("final %+v", r)
	}
}

func TestInstanceAllocationNamesTheNode(t *testing.T) {
	f := newFake(t)
	f.alloc.Kind, f.alloc.HostID, f.alloc.InstanceID = api.AllocationInstance, "", "inst-1"
	f.instances = map[string]string{"inst-1": "node-1"}
	rep, _, _ := runFake(t, f, func(c *Config) { c.NodeID = "" })
	if !rep.Classification.OK || rep.NodeID != "node-1" || hopOf(rep, signal.HopAllocationBinding).Data["instance_id"] != "inst-1" {
		t.Fatalf("report %+v %+v", rep.Classification, hopOf(rep, signal.HopAllocationBinding))
	}
}

func TestStoreRouteMissing(t *testing.T) {
	f := newFake(t)
	f.storeCode = http.StatusNotFound
	rep, warnings, _ := runFake(t, f, nil)
	if !rep.Classification.OK || !slices.Equal(warnings, []string{"control plane does not store preflight runs"}) {
		t.Fatalf("ok %v, warnings %v", rep.Classification.OK, warnings)
	}
}

func TestUsageErrors(t *testing.T) {
	for name, c := range map[string]Config{
		"no api":              {NodeID: "n", Timeout: time.Second},
		"no node":             {APIBase: "http://x", Timeout: time.Second},
		"smoke without alloc": {APIBase: "http://x", NodeID: "n", RunWSSmoke: true, Timeout: time.Second},
		"local and host":      {APIBase: "http://x", NodeID: "n", NodeLocal: true, NodeHost: "h", Timeout: time.Second},
		"bad url":             {APIBase: "x", NodeID: "n", Timeout: time.Second},
		"bad terminal url":    {APIBase: "http://x", NodeID: "n", NodeTerminalURL: "term:8443", Timeout: time.Second},
		"no timeout":          {APIBase: "http://x", NodeID: "n"},
	} {
		_, err := Run(context.Background(), c)
		if _, ok := err.(*UsageError); !ok {
			t.Errorf("%s: %v, want a UsageError", name, err)
		}
	}
}
