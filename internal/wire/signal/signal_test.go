package signal

import (
	"regexp"
	"slices"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

func TestSignalTable(t *testing.T) {
	name := regexp.MustCompile(`^[a-z][a-z0-9_]+$`)
	hops := map[Hop]bool{}
	for _, h := range Hops() {
		if hops[h.Hop] {
			t.Errorf("hop %s listed twice", h.Hop)
		}
		hops[h.Hop] = true
	}
	statuses := []api.HostStatus{"", api.HostStale, api.HostAuthFailed, api.HostAPIUnreachable, api.HostTaskResultFailed}
	seen := map[Name]bool{}
	used := map[Hop]bool{}
	for _, s := range Signals() {
		switch {
		case !name.MatchString(string(s.Name)):
			t.Errorf("signal %q: not a snake_case name", s.Name)
		case seen[s.Name]:
			t.Errorf("signal %s listed twice", s.Name)
		case s.Domain != DomainNode && s.Domain != DomainTerminal && s.Domain != DomainControlPlane:
			t.Errorf("signal %s: domain %q", s.Name, s.Domain)
		case s.Symptom == "" || s.Check == "" || s.Owner == "" || s.Recovery == "":
			t.Errorf("signal %s: symptom, check, owner and recovery are all required", s.Name)
		case len(s.Hops) == 0:
			t.Errorf("signal %s: no hop reports it", s.Name)
		case !slices.Contains(statuses, s.HostStatus):
			t.Errorf("signal %s: host status %q is not one a signal may set", s.Name, s.HostStatus)
		}
		seen[s.Name] = true
		for _, h := range s.Hops {
			if !hops[h] {
				t.Errorf("signal %s: unknown hop %s", s.Name, h)
			}
			used[h] = true
		}
		if got, ok := Lookup(s.Name); !ok || got.Name != s.Name {
			t.Errorf("Lookup(%s) = %v, %v", s.Name, got.Name, ok)
		}
	}
	for h := range hops {
		if !used[h] && h != HopClassification {
			t.Errorf("hop %s reports no signal", h)
		}
	}
	if _, ok := Lookup("no_such_signal"); ok {
		t.Error("Lookup found an unknown signal")
	}
}

// The names the operator runbook and dashboards depend on: renaming one
// breaks them, so the list is spelled out here.
func TestSignalNamesAreTheContract(t *testing.T) {
	want := []Name{"node_agent_heartbeat_stale", "node_agent_api_unreachable", "node_agent_api_tls_failed",
		"node_agent_auth_failed", "node_task_claim_failed", "node_task_result_post_failed", "node_agent_process_down",
		"disk_full", "node_observability_disk_pressure", "node_agent_binary_invalid", "node_ops_ssh_failed",
		"node_ops_access_unhealthy", "edge_rate_limited", "terminal_token_mint_failed", "terminal_public_route_missing",
		"terminal_gateway_upgrade_failed", "terminal_node_stream_timeout", "terminal_open_without_stream",
		"terminal_node_stream_mtls_failed", "terminal_pty_failed", "terminal_ui_connecting_stuck", "terminal_env_profile_drift"}
	for _, n := range want {
		if _, ok := Lookup(n); !ok {
			t.Errorf("signal %s missing", n)
		}
	}
	wantHops := []Hop{"node_readiness", "node_heartbeat", "node_recovery_status", "node_runtime_api_reachability",
		"terminal_public_route", "browser_terminal_ws", "node_terminal_reachability", "workload_terminal_startup_failure"}
	for _, h := range wantHops {
		if !slices.ContainsFunc(Hops(), func(i HopInfo) bool { return i.Hop == h }) {
			t.Errorf("hop %s missing", h)
		}
	}
}

func TestFromTerminalCode(t *testing.T) {
	tests := []struct {
		code terminal.ErrorCode
		want Name
		ok   bool
	}{
		{terminal.CodeNodeStreamTimeout, NodeStreamTimeout, true},
		{terminal.CodePTYFailed, PTYFailed, true},
		{terminal.CodeNodeStreamMTLSFailed, NodeStreamMTLSFailed, true},
		{terminal.CodeOpenWithoutStream, OpenWithoutStream, true},
		{terminal.CodeNodeOffline, HeartbeatStale, true},
		{terminal.CodeDispatchTimeout, TaskClaimFailed, true},
		{terminal.CodeGatewayError, GatewayUpgradeFailed, true},
		{terminal.CodeAllocationInactive, AllocationNotReady, true},
		{terminal.CodeTokenReused, "", false},
		{terminal.CodeSessionIdleTimeout, "", false},
	}
	for _, tc := range tests {
		got, ok := FromTerminalCode(tc.code)
		if got != tc.want || ok != tc.ok {
			t.Errorf("FromTerminalCode(%s) = %s, %v; want %s, %v", tc.code, got, ok, tc.want, tc.ok)
		}
		if ok {
			if _, known := Lookup(got); !known {
				t.Errorf("FromTerminalCode(%s) = %s, not in the table", tc.code, got)
			}
		}
	}
}
