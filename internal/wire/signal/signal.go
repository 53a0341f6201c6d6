// Package signal owns Drover's outage vocabulary: the signals that name what
// failed, the preflight hops that name where, and who owns the repair. The
// agent reports signals about itself, the control plane maps them to host
// statuses and preflight reports them per hop; the operator runbook
// (docs/runbooks/preflight.md) and docs/contract.md are generated from the
// tables here, so code, docs and dashboard use the same names.
package signal

import "github.com/drover-dev/drover/internal/wire/api"

// Name is a signal name, e.g. "node_agent_api_unreachable".
type Name string

// Domain groups signals the way the runbook's two matrices do.
type Domain string

// The failure domains.
const (
	DomainNode         Domain = "node_agent"
	DomainTerminal     Domain = "terminal"
	DomainControlPlane Domain = "control_plane"
)

// The signals. Node-agent connectivity first, then terminal readiness.
const (
	HeartbeatStale       Name = "node_agent_heartbeat_stale"
	APIUnreachable       Name = "node_agent_api_unreachable"
	APITLSFailed         Name = "node_agent_api_tls_failed"
	AuthFailed           Name = "node_agent_auth_failed"
	TaskClaimFailed      Name = "node_task_claim_failed"
	TaskResultPostFailed Name = "node_task_result_post_failed"
	ProcessDown          Name = "node_agent_process_down"
	DiskFull             Name = "disk_full"
	DiskPressure         Name = "node_observability_disk_pressure"
	BinaryInvalid        Name = "node_agent_binary_invalid"
	OpsSSHFailed         Name = "node_ops_ssh_failed"
	OpsAccessUnhealthy   Name = "node_ops_access_unhealthy"
	HealthProbeUnhealthy Name = "node_health_probe_unhealthy"
	EdgeRateLimited      Name = "edge_rate_limited"
	AllocationNotReady   Name = "allocation_not_ready"
	TokenMintFailed      Name = "terminal_token_mint_failed"
	PublicRouteMissing   Name = "terminal_public_route_missing"
	GatewayUpgradeFailed Name = "terminal_gateway_upgrade_failed"
	NodeStreamTimeout    Name = "terminal_node_stream_timeout"
	OpenWithoutStream    Name = "terminal_open_without_stream"
	NodeStreamMTLSFailed Name = "terminal_node_stream_mtls_failed"
	PTYFailed            Name = "terminal_pty_failed"
	UIConnectingStuck    Name = "terminal_ui_connecting_stuck"
	EnvProfileDrift      Name = "terminal_env_profile_drift"
	ControlPlaneFailed   Name = "control_plane_api_failed"
	// Slice allocations (internal/cp/sliceflow).
	SliceSlotsUnavailable Name = "slice_slots_unavailable"
	SliceProvisionFailed  Name = "slice_vm_provision_failed"
	SliceWorkflowStuck    Name = "slice_workflow_stuck"
	SliceGuestUserFailed  Name = "slice_guest_user_failed"
)

// Signal is one row of the runbook: what the operator sees, the quickest
// check, who owns the repair, how to repair, and where preflight reports it.
type Signal struct {
	Name     Name
	Domain   Domain
	Symptom  string
	Check    string // the fast preflight, with Drover's commands
	Owner    string
	Recovery string
	// Hops are the preflight hops that report this signal, first the usual.
	Hops []Hop
	// HostStatus is the host status the control plane shows while this is
	// the host's current problem; "" leaves the status as heartbeats make it
	// and only records the signal as the last failure.
	HostStatus api.HostStatus
}

// Signals returns the signal table (a fresh slice, in runbook order).
func Signals() []Signal {
	return []Signal{
		{HeartbeatStale, DomainNode, "Host status stale; no heartbeat for 3 intervals",
			"`drover hosts show <id>` (last_seen, status_reason); on the node `drover-agent status`",
			"Node runtime / provider network", "Restart drover-agent if it is down; otherwise repair route, DNS or firewall first",
			[]Hop{HopNodeHeartbeat}, api.HostStale},
		{APIUnreachable, DomainNode, "The node cannot reach the control plane (DNS, refused, timeout)",
			"`drover preflight --node-id <id> --node-host <host>` (hop node_runtime_api_reachability); on the node `drover-agent preflight`",
			"Environment networking", "Fix VPN/private route, DNS, firewall or the endpoint profile (NODE_AGENT_CONTROL_PLANE_URL)",
			[]Hop{HopNodeRuntimeAPIReachability}, api.HostAPIUnreachable},
		{APITLSFailed, DomainNode, "TLS to the control plane fails from the node",
			"`drover-agent preflight` on the node: TLS probe with the node's CA bundle",
			"PKI / edge profile", "Refresh the CA bundle (re-enrol) or repair CA drift; make sure the URL reaches the node listener, not a TLS-terminating edge",
			[]Hop{HopNodeRuntimeAPIReachability}, api.HostAPIUnreachable},
		{AuthFailed, DomainNode, "The agent's requests are refused (401/403): revoked, superseded or foreign identity",
			"`drover hosts show <id>` (status auth_failed, status_reason); `drover audit --target <id>` (node.auth records)",
			"PKI / node enrolment", "Re-enrol with a new bootstrap token (`drover hosts rotate-token`), restore the certificate, or revoke a cloned identity",
			[]Hop{HopNodeRecoveryStatus, HopNodeRuntimeAPIReachability}, api.HostAuthFailed},
		{TaskClaimFailed, DomainNode, "The agent polls but claims no task, or refuses what it claims (signature, key, expiry)",
			"`drover tasks list --node <id> --state queued`; agent log `task verification failed`",
			"Control plane / node-agent version", "Roll the agent to a compatible build or repair the task signing keys (`drover keys`)",
			[]Hop{HopNodeRecoveryStatus}, ""},
		{TaskResultPostFailed, DomainNode, "The agent claims tasks but cannot post their results",
			"`drover tasks show <task>` (stays running); `drover-agent status` (spooled results)",
			"API / node-agent network", "Repair the result route; spooled results are posted again on their own. Do not mark the workload failed",
			[]Hop{HopNodeRecoveryStatus}, api.HostTaskResultFailed},
		{ProcessDown, DomainNode, "drover-agent is not running",
			"`systemctl status drover-agent` and `journalctl -u drover-agent`",
			"Node runtime", "Restart it; check the binary's architecture, the env file, certificate paths and permissions",
			[]Hop{HopNodeHeartbeat, HopNodeReadiness}, ""},
		{DiskFull, DomainNode, "Writes fail with no space left on device",
			"`df -h /` and the agent state dir; `drover-agent preflight` (hop node_readiness)",
			"Node runtime / observability", "Free space, stop runaway local buffers, rotate logs, then rerun preflight",
			[]Hop{HopNodeReadiness, HopNodeRecoveryStatus}, ""},
		{DiskPressure, DomainNode, "The agent's filesystem is fuller than its pressure threshold",
			"`df -h /`; `drover-agent status` (diagnostic)",
			"Node runtime / observability", "Free space and rotate or drop local buffers; the agent renews and heartbeats again on its own",
			[]Hop{HopNodeReadiness, HopNodeRecoveryStatus}, ""},
		{BinaryInvalid, DomainNode, "Exec format error, wrong architecture or an incompatible protocol version",
			"`file $(command -v drover-agent)`, `drover-agent version`; the installer checks the architecture",
			"Bootstrap / release packaging", "Install the agent built for this architecture and a protocol the control plane speaks",
			[]Hop{HopNodeReadiness}, ""},
		{OpsSSHFailed, DomainNode, "SSH to the node fails while the agent heartbeats",
			"`drover hosts show <id>` (healthy) beside `ssh <user>@<host>`",
			"Ops access / provider network", "Fix SSH, the user or the firewall separately; the agent is not down",
			[]Hop{HopNodeOpsAccess}, ""},
		{OpsAccessUnhealthy, DomainNode, "SSH connections are reset while the agent heartbeats",
			"Compare the heartbeat with SSH and the provider's guest-agent status",
			"Provider VM runtime / ops access", "Repair the guest OS access path or recreate the worker: agent liveness alone is not day-2 operability",
			[]Hop{HopNodeOpsAccess}, ""},
		{HealthProbeUnhealthy, DomainNode, "The host's health is unhealthy: its last diag.health_probe (scheduled or run by hand) failed a check",
			"`drover hosts show <id>` (health, health_summary, health_task_id); `drover tasks show <health_task_id>` (the failed checks)",
			"Node runtime / host hardware", "Repair what the failed checks name (kvm, vfio, gpu, fabric, root_fs, diagnostic path); the next probe makes the host healthy again",
			[]Hop{HopNodeRecoveryStatus}, ""},
		{EdgeRateLimited, DomainNode, "Requests answered 429: the agent slows down and never retries harder",
			"`drover-agent status` (diagnostic edge_rate_limited); check the URL is the node-facing listener",
			"Environment / edge policy", "Point the agent at the node-facing endpoint; only then review edge rate limits",
			[]Hop{HopNodeRuntimeAPIReachability}, api.HostAPIUnreachable},
		{AllocationNotReady, DomainTerminal, "The allocation is not active or not bound to the node",
			"`drover allocations show <id>` (state, host_id)",
			"API / allocation state", "Wait for provisioning to finish, or recreate the allocation on the intended node",
			[]Hop{HopAllocationBinding}, ""},
		{TokenMintFailed, DomainTerminal, "Terminal token mint fails",
			"The API's error envelope (code, correlation_id); `drover allocations terminal-token <id>`",
			"API / authz / allocation state", "Fix the operator's role, the token, or the allocation's active state",
			[]Hop{HopTerminalTokenMint}, ""},
		{PublicRouteMissing, DomainTerminal, "The browser-facing terminal route is missing",
			"`curl <terminal-base>/healthz` (not the root, which an edge may 404)",
			"Edge / proxy", "Repair the terminal host route, health path and WebSocket upgrade config",
			[]Hop{HopTerminalPublicRoute}, ""},
		{GatewayUpgradeFailed, DomainTerminal, "The browser's WebSocket upgrade fails or is never answered",
			"`drover preflight --run-ws-smoke`; gateway log and browser close code",
			"Terminal gateway / edge", "Repair the route, token subprotocol forwarding, session binding (store) or gateway health",
			[]Hop{HopBrowserTerminalWS}, ""},
		{NodeStreamTimeout, DomainTerminal, "The gateway accepts the browser, then closes with node_stream_timeout",
			"`drover-agent preflight` on the node (hop node_terminal_reachability to NODE_AGENT_TERMINAL_URL)",
			"Node-facing terminal endpoint / profile", "Fix the node-facing terminal route, port, DNS or firewall",
			[]Hop{HopNodeTerminalReachability, HopWorkloadTerminalStartup, HopBrowserTerminalWS}, ""},
		{OpenWithoutStream, DomainTerminal, "terminal.open succeeded but no node stream arrived",
			"`drover tasks show <terminal.open task>` beside `drover terminal-sessions show <sid>`",
			"Node-agent terminal callback / stale agent build", "Upgrade the agent to a build that reports success only after its stream is up, then fix the endpoint",
			[]Hop{HopGatewayNodeStream, HopWorkloadTerminalStartup}, ""},
		{NodeStreamMTLSFailed, DomainTerminal, "The node stream reaches the gateway but its client certificate is rejected",
			"Gateway log (node stream TLS); `drover hosts show <id>` (cert serial, not after)",
			"PKI / terminal gateway", "Repair the node certificate, the CA bundle, or the gateway's client-certificate policy",
			[]Hop{HopWorkloadTerminalStartup, HopNodeTerminalReachability}, ""},
		{PTYFailed, DomainTerminal, "The node stream connected but the PTY or shell failed",
			"Agent log for the session; `drover allocations show <id>` (user)",
			"Node runtime / allocation user", "Repair the allocation user, its shell or PTY permissions (recreate the allocation)",
			[]Hop{HopWorkloadTerminalStartup}, ""},
		{UIConnectingStuck, DomainTerminal, "The browser stays on Connecting... past the node-stream timeout",
			"Browser console; the console shows this code after its guard (45 s)",
			"Web UX / terminal gateway contract", "Return a structured error frame and map it to recovery text",
			[]Hop{HopBrowserTerminalWS}, ""},
		{EnvProfileDrift, DomainTerminal, "The agent's terminal URL differs from its host's environment profile",
			"`drover hosts show <id>` (profile terminal URL vs reported); `drover preflight`",
			"Environment profile", "Fix the profile or the agent's NODE_AGENT_TERMINAL_URL; record the drift",
			[]Hop{HopNodeTerminalReachability}, ""},
		{ControlPlaneFailed, DomainControlPlane, "The control plane's operator API answers 5xx or cannot be reached: its store (SQLite file or PostgreSQL), which also holds the terminal session binding, is down or the process is",
			"The error envelope's correlation_id in `drover server`'s log; `curl <api-base>/readyz`",
			"Control plane / store", "Bring the store back (PostgreSQL running and reachable, SQLite file writable) or restart the control plane; nothing on the nodes needs repair",
			[]Hop{HopAllocationBinding, HopNodeHeartbeat, HopNodeRecoveryStatus, HopTerminalTokenMint}, ""},
		{SliceSlotsUnavailable, DomainControlPlane, "A slice allocation failed at lease_slots: the host has fewer free approved slots than asked (others leased them, or none are approved)",
			"`drover allocations show <id>` (workflow.failed_step, error); `drover hosts slots <host>` beside `drover allocations list --host <host>`",
			"Operator / capacity", "Release unused slice allocations, approve more slots (`drover hosts approve-slots`), or ask for fewer slots or another host",
			[]Hop{HopAllocationBinding}, ""},
		{SliceProvisionFailed, DomainNode, "A slice allocation failed at await_provision: slice.vm_provision failed on the node (the failed phase names where) or expired unanswered",
			"`drover allocations show <id>` (workflow.phases, failed_step, error); `drover tasks show <provision_task_id>`",
			"Node runtime / slice host", "Repair what the failed phase names (image, VFIO binding, NVMe, readiness); the workflow already released the VM and its slots, so recreate the allocation",
			[]Hop{HopAllocationBinding}, ""},
		{SliceWorkflowStuck, DomainControlPlane, "A slice allocation failed at await_provision because slice.vm_provision never answered: no result and no expiry past the sweep's bound (sliceflow.StuckAfter), or the task is gone from the store",
			"`drover allocations show <id>` (workflow.failed_step, error, correlation_id); `drover tasks show <provision_task_id>`; the node's agent log for the correlation id",
			"Control plane / node", "Check that the node is up and claims tasks and that the control plane's reaper runs; the workflow already released the VM and its slots, so recreate the allocation",
			[]Hop{HopAllocationBinding}, ""},
		{SliceGuestUserFailed, DomainNode, "A slice allocation failed at provision_user: allocation.provision_user could not make the allocation's user inside the VM over the brokered SSH channel (the result code names the hop: guest_user_failed, guest_ssh_unreachable, guest_host_key_mismatch, guest_auth_failed, guest_terminal_unavailable) or expired unanswered",
			"`drover allocations show <id>` (workflow.failed_step, error); `drover tasks show <provision_user task_id>` (the step's task_id); the VM's serial log on the node",
			"Node / slice guest", "Repair what the code names (the guest's sshd, its terminal key, a user name the image reserves); the workflow already removed the user, released the VM and its slots, so recreate the allocation",
			[]Hop{HopAllocationBinding}, ""},
	}
}

// Lookup returns the signal named n.
func Lookup(n Name) (Signal, bool) {
	for _, s := range Signals() {
		if s.Name == n {
			return s, true
		}
	}
	return Signal{}, false
}
