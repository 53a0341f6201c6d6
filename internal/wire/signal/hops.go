package signal

import "github.com/drover-dev/drover/internal/wire/terminal"

// Hop names one check of the preflight chain: where an outage is.
type Hop string

// The preflight hops, in the order preflight runs them.
const (
	HopAllocationBinding          Hop = "allocation_binding"
	HopNodeHeartbeat              Hop = "node_heartbeat"
	HopNodeOpsAccess              Hop = "node_ops_access"
	HopNodeReadiness              Hop = "node_readiness"
	HopNodeRuntimeAPIReachability Hop = "node_runtime_api_reachability"
	HopNodeRecoveryStatus         Hop = "node_recovery_status"
	HopTerminalTokenMint          Hop = "terminal_token_mint"
	HopTerminalPublicRoute        Hop = "terminal_public_route"
	HopBrowserTerminalWS          Hop = "browser_terminal_ws"
	HopWorkloadTerminalStartup    Hop = "workload_terminal_startup_failure"
	HopNodeTerminalReachability   Hop = "node_terminal_reachability"
	HopGatewayNodeStream          Hop = "gateway_node_stream"
	HopClassification             Hop = "final_classification"
)

// HopInfo describes one hop.
type HopInfo struct {
	Hop Hop
	// Checks says what the hop proves.
	Checks string
	// OnNode is true for hops that run on the node itself (drover-agent
	// preflight, locally or over SSH).
	OnNode bool
}

// Hops returns the hops in order (a fresh slice).
func Hops() []HopInfo {
	return []HopInfo{
		{HopAllocationBinding, "the allocation is active and bound to the node", false},
		{HopNodeHeartbeat, "the node's heartbeat is fresh (the host is not stale and was heard from within 4 intervals); its task poll is node_recovery_status's check", false},
		{HopNodeOpsAccess, "the operator's SSH path to the node (only when node-side checks run over SSH)", false},
		{HopNodeReadiness, "on the node: root and state filesystem usage, diagnostic path writable, agent binary matches the host", true},
		{HopNodeRuntimeAPIReachability, "on the node: DNS, TCP, TLS and mTLS to the control plane's node API with the node's certificate", true},
		{HopNodeRecoveryStatus, "a diag.health_probe task is claimed and its result posted (and the host is not auth_failed or task_result_failed)", false},
		{HopTerminalTokenMint, "a terminal token can be minted for the allocation", false},
		{HopTerminalPublicRoute, "the terminal gateway's /healthz answers 200 at the browser-facing base", false},
		{HopBrowserTerminalWS, "the browser-facing WebSocket is accepted or rejected on purpose, with a structured frame, never left hanging", false},
		{HopWorkloadTerminalStartup, "terminal.open runs and the session reaches ready (with --run-ws-smoke)", false},
		{HopNodeTerminalReachability, "on the node: DNS, TCP, TLS and mTLS to the node-facing terminal URL; the URL matches the host's profile", true},
		{HopGatewayNodeStream, "the gateway saw the node's stream for the same session id", false},
		{HopClassification, "the first failed hop, its signal and its owner", false},
	}
}

// FromTerminalCode maps a terminal gateway error code (a close reason) to
// its signal; ok is false for codes that are not outages (the user's own
// errors, idle timeouts).
func FromTerminalCode(c terminal.ErrorCode) (Name, bool) {
	switch c {
	case terminal.CodeNodeOffline:
		return HeartbeatStale, true
	case terminal.CodeDispatchTimeout:
		return TaskClaimFailed, true
	case terminal.CodeNodeStreamTimeout:
		return NodeStreamTimeout, true
	case terminal.CodePTYFailed:
		return PTYFailed, true
	case terminal.CodeNodeStreamMTLSFailed:
		return NodeStreamMTLSFailed, true
	case terminal.CodeOpenWithoutStream:
		return OpenWithoutStream, true
	case terminal.CodeGatewayError, terminal.CodeProtocolError, terminal.CodeOriginForbidden:
		return GatewayUpgradeFailed, true
	case terminal.CodeAllocationInactive:
		return AllocationNotReady, true
	}
	return "", false
}
