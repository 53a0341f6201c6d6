package integration

// The meanings docs/contract.md gives the names the code declares without
// a description of its own. TestContractDoc fails when a name here is not
// in the code, or a name in the code is not here.

// nodeRouteMeaning is keyed by nodeapi.Route.Name.
func nodeRouteMeaning() map[string]string {
	return map[string]string{
		"register":          "enrol a host: bootstrap token, CSR and capabilities → identity (certificate, CA bundle, JWKS, heartbeat interval)",
		"renew":             "a new certificate for a new CSR",
		"heartbeat":         "liveness, capacity and agent diagnostic → the heartbeat interval (a 204 with `Drover-Heartbeat-Interval` for `Prefer: return=minimal`); the answer's `ETag` lets an unchanged heartbeat go without a body, as `If-Match` (412 `heartbeat_state_unknown` when the replica does not hold it)",
		"jwks":              "the current task-signing keys",
		"put_capabilities":  "capabilities and inventory, re-sent when they change",
		"wait_task":         "long-poll for the next signed task: 200 with a delivery, or 204; ?max=N (at most 32) claims up to N, the others in the delivery's more",
		"post_event":        "task progress; the first event moves the task to running",
		"post_result":       "the task's result",
		"post_results":      "the results of up to 64 of the node's tasks, each answered on its own (status, state or error)",
		"desired_instances": "the node's desired instance set; long-polls while the etag is current",
		"instance_status":   "one instance status transition (phase, reason, generation)",
		"instance_secrets":  "the values of the secrets an instance placed on this node names (Cache-Control: no-store); 404 for another node's instance or a name its spec does not list",
		"terminal_stream":   "the node's terminal stream for a session (with the session's nonce in X-Drover-Terminal-Nonce)",
		"logs_stream":       "the node's log stream for a logs.open session (with the session's nonce in X-Drover-Logs-Nonce; logstream frames)",
	}
}

func operatorRouteMeaning() map[string]string {
	return map[string]string{
		"GET /api/v1/hosts":                             "list hosts",
		"POST /api/v1/hosts":                            "create a host record (answers its bootstrap token once)",
		"GET /api/v1/hosts/{id}":                        "show a host",
		"POST /api/v1/hosts/{id}/enable":                "enable a host",
		"POST /api/v1/hosts/{id}/disable":               "disable a host: no scheduling, its node requests refused",
		"POST /api/v1/hosts/{id}/rotate-token":          "issue a new bootstrap token",
		"POST /api/v1/hosts/{id}/revoke":                "revoke a host's identity for good",
		"GET /api/v1/hosts/{id}/slots":                  "list a host's approved slots",
		"POST /api/v1/hosts/{id}/slots":                 "approve candidates of a succeeded slice.topology_discover task",
		"DELETE /api/v1/hosts/{id}/slots/{slot_id}":     "remove an approved slot",
		"POST /api/v1/hosts/{id}/drain":                 "drain a host: no new instances, its instances stop",
		"POST /api/v1/hosts/{id}/undrain":               "end a drain",
		"POST /api/v1/hosts/{id}/profile":               "set the host's environment profile (node API and terminal URLs); a mismatch with the agent's is recorded as terminal_env_profile_drift",
		"GET /api/v1/preflight-runs":                    "stored preflight runs, newest first (?host_id=, ?correlation_id=)",
		"POST /api/v1/preflight-runs":                   "store a preflight report (validated); a pass sets the host's last_successful_preflight_at",
		"GET /api/v1/preflight-runs/{id}":               "one stored preflight run with its report",
		"GET /api/v1/evidence/{correlation_id}":         "the evidence bundle (tar.gz) of a correlation id: preflight runs, tasks, audit, terminal sessions, agent diagnostics, manifest",
		"POST /api/v1/placements/check":                 "where would these resources fit",
		"GET /api/v1/instances":                         "list instances",
		"POST /api/v1/instances":                        "create an instance",
		"GET /api/v1/instances/{id}":                    "show an instance (by id or name)",
		"GET /api/v1/instances/{id}/events":             "the instance's status transitions, oldest first (?limit=, default 100, at most 200)",
		"GET /api/v1/instances/{id}/logs":               "the instance's logs from its node: text/plain (end in the X-Drover-Logs-End trailer) or text/event-stream (?follow=, since=RFC 3339|duration, tail=)",
		"POST /api/v1/instances/{id}/stop":              "desired state stopped",
		"POST /api/v1/instances/{id}/start":             "desired state running (retries a Failed instance)",
		"DELETE /api/v1/instances/{id}":                 "delete an instance (force=true: forget the record at once)",
		"POST /api/v1/instance-groups/{group}/scale":    "scale an instance group to a replica count",
		"GET /api/v1/allocations":                       "list allocations",
		"POST /api/v1/allocations":                      "create an allocation (a user on a host, or an instance)",
		"GET /api/v1/allocations/{id}":                  "show an allocation",
		"DELETE /api/v1/allocations/{id}":               "release an allocation",
		"POST /api/v1/allocations/{id}/terminal-token":  "mint a single-use terminal token",
		"GET /api/v1/allocations/{id}/sessions":         "an allocation's terminal sessions",
		"GET /api/v1/terminal-sessions/{sid}":           "a terminal session with its readiness hops",
		"GET /api/v1/terminal-sessions/{sid}/recording": "a session's asciicast recording",
		"GET /api/v1/tasks":                             "list tasks",
		"POST /api/v1/tasks":                            "enqueue a task",
		"POST /api/v1/tasks:batch":                      "enqueue up to 1000 tasks in one transaction (all or none)",
		"GET /api/v1/tasks/{id}":                        "show a task (wait= long-polls for its end)",
		"POST /api/v1/tasks/{id}/cancel":                "cancel a task",
		"GET /api/v1/task-types":                        "the registered task types",
		"GET /api/v1/tokens":                            "list operator tokens",
		"POST /api/v1/tokens":                           "create an operator token",
		"POST /api/v1/tokens/{id}/revoke":               "revoke an operator token",
		"GET /api/v1/secrets":                           "workload secrets: names, versions and timestamps, never values",
		"GET /api/v1/secrets/{name}":                    "one workload secret's metadata (never its value)",
		"PUT /api/v1/secrets/{name}":                    "set or replace a workload secret's value (sealed with the KEK; version + 1)",
		"DELETE /api/v1/secrets/{name}":                 "delete a workload secret",
		"GET /api/v1/audit":                             "the audit log",
		"POST /api/v1/signing-keys/rotate":              "rotate the task-signing key",
		"GET /api/v1/ca":                                "the CA certificate, its pin hash and the node URL",
		"GET /healthz":                                  "liveness",
		"GET /readyz":                                   "readiness (the store answers)",
		"GET /metrics":                                  "Prometheus metrics",
		"GET /api/v1/terminal":                          "the browser's terminal WebSocket; the terminal token (a subprotocol) is the credential",
		"GET /ui/":                                      "the web console",
		"GET /{$}":                                      "redirects to /ui/",
		"GET /ui/login":                                 "the dashboard's login form (sets its double-submit CSRF cookie)",
		"POST /ui/login":                                "dashboard login: the operator token for a session cookie",
		"POST /ui/logout":                               "dashboard logout (session cookie and CSRF token)",
		"GET /ui/fleet":                                 "the dashboard's fleet page (session cookie)",
		"GET /ui/fleet/events":                          "the fleet table's rows as server-sent events (session cookie)",
		"GET /ui/hosts/{id}":                            "the dashboard's host page (session cookie)",
		"GET /ui/hosts/{id}/live":                       "the host page's live block (status, heartbeat, capacity, latest preflight run) as an htmx fragment, polled each heartbeat interval (session cookie)",
		"POST /ui/hosts/{id}/actions/{action}":          "a dashboard host action through the operator API (session cookie, CSRF token, role operator)",
		"GET /ui/evidence/{cid}":                        "an evidence bundle through the operator API, as an attachment (session cookie, role operator)",
		"GET /ui/tasks":                                 "the dashboard's task list, filtered by host, type and state (session cookie)",
		"GET /ui/tasks/{id}":                            "the dashboard's task page: envelope, state history, phase chart, result (session cookie)",
		"GET /ui/audit":                                 "the dashboard's audit log, filtered by actor, role, action, target and time (session cookie)",
		"GET /ui/audit/export":                          "the filtered audit records as JSON lines, as an attachment (session cookie)",
		"GET /ui/instances":                             "the dashboard's instance list: desired vs actual, generation, runtime, health check; filtered by host, phase, desired state and search (session cookie)",
		"GET /ui/instances/{id}":                        "the dashboard's instance page: desired vs actual, spec, health, status transitions with a phase timeline, serial console and recordings (session cookie)",
		"GET /ui/instances/{id}/logs":                   "the instance page's live log view as server-sent events (session cookie)",
		"POST /ui/instances/{id}/actions/{action}":      "a dashboard instance action (start, stop, or delete with the name typed back) through the operator API (session cookie, CSRF token, role operator)",
		"GET /ui/allocations":                           "the dashboard's allocation list, filtered by host, instance and state (session cookie)",
		"GET /ui/allocations/{id}":                      "the dashboard's allocation page: its tasks and terminal sessions, each with its readiness chain, failure signal, close reason and replay link (session cookie)",
		"GET /ui/allocations/{id}/terminal":             "the dashboard's browser terminal of an allocation (session cookie, role operator)",
		"POST /ui/allocations/{id}/terminal-token":      "a single-use terminal token minted through the operator API, as JSON (session cookie, CSRF token, role operator)",
		"GET /ui/sessions/{sid}/replay":                 "the dashboard's replay of a terminal session's recording (session cookie)",
		"GET /ui/sessions/{sid}/recording":              "a terminal session's asciicast recording through the operator API (session cookie, role operator)",
	}
}

func instancePhaseMeaning() map[string]string {
	return map[string]string{
		"Pending":  "placed on a host; the agent has not started it yet",
		"Booting":  "the runtime started it; readiness is not met yet",
		"Ready":    "readiness met (serial marker and/or TCP port, or process running)",
		"Draining": "being stopped: graceful shutdown under way",
		"Stopped":  "stopped (by the operator, a drain or a delete)",
		"Failed":   "failed; the reason code says why",
	}
}

func reasonCodeMeaning() map[string]string {
	return map[string]string{
		"image_pull_failed":        "the image could not be fetched, verified or was unsafe",
		"rootfs_build_failed":      "the instance's disk or cloud-init seed could not be built, or the disk spec is invalid",
		"firecracker_start_failed": "a Firecracker microVM failed to start: spawning firecracker or the jailer, its API socket, a configuration request or InstanceStart, with the step and Firecracker's fault_message (the firecracker runtime; QEMU reports vm_start_failed)",
		"vm_start_failed":          "QEMU failed to start the VM",
		"container_start_failed":   "the container engine could not create, start or stop the container, or the container spec is invalid (docker runtime)",
		"network_setup_failed":     "the network (forwards, tap on a bridge) could not be set up",
		"volume_attach_failed":     "the boot device, a container's volume or a microVM's named volume could not be attached: a microVM volume held by another instance, asked for with a larger size or another format than it has, holding no filesystem, or failing the guest's mount",
		"secrets_missing":          "a secret the instance names is not on the host",
		"secrets_injection_failed": "secrets could not be put into the guest's cloud-init seed",
		"healthcheck_failed":       "readiness timed out or a health check failed",
		"oom_killed":               "the guest was killed for lack of memory",
		"crash_loop_backoff":       "five restarts within ten minutes; restarts go on with backoff",
		"terminated_by_operator":   "stopped or deleted by an operator",
		"node_draining":            "stopped because its host is draining",
	}
}

func hostStatusMeaning() map[string]string {
	return map[string]string{
		"healthy":            "heartbeating; schedulable when also enabled, not revoked and not draining",
		"stale":              "three heartbeat intervals missed",
		"auth_failed":        "a superseded certificate of the host was presented (another party holds an identity of it)",
		"api_unreachable":    "reserved for agent-reported reachability problems",
		"task_result_failed": "the agent reports it cannot post task results",
		"unknown":            "never heard from",
	}
}

func taskStateMeaning() map[string]string {
	return map[string]string{
		"queued":     "waiting for its node to claim it (again, after a lease ran out)",
		"dispatched": "claimed by the node; the lease runs",
		"running":    "the agent reported progress",
		"succeeded":  "the agent reported success",
		"failed":     "the agent reported failure",
		"expired":    "not finished by its expires_at",
		"canceled":   "canceled by an operator",
	}
}

func allocationStateMeaning() map[string]string {
	return map[string]string{
		"provisioning": "allocation.provision_user is queued or running",
		"active":       "usable: terminals may be opened",
		"failed":       "provisioning failed (the task's error code)",
		"releasing":    "allocation.deprovision_user is queued or running, or failed (state_reason says why; release again to retry)",
		"released":     "released; its terminals are closed",
	}
}

func terminalStateMeaning() map[string]string {
	return map[string]string{
		"token_ready":           "a terminal token was minted for an active allocation",
		"browser_ws_ready":      "the browser's WebSocket was accepted and its token redeemed",
		"terminal_open_sent":    "the gateway queued the signed terminal.open task",
		"node_stream_connected": "the agent's stream reached the gateway over mTLS",
		"pty_ready":             "the shell (or serial console) is attached; the agent sent ready",
		"failed":                "the session failed after the last state it reached; its error code says why",
	}
}

// vmPhaseMeaning is keyed by phase name: provision phases, cleanup steps
// (run after a failed provision) and release phases.
func vmPhaseMeaning() map[string]string {
	return map[string]string{
		"device_check":             "before any phase: every device the task touches is a candidate slot's and not leased to another VM",
		"lease_acquire":            "take per-slot leases",
		"host_dependencies":        "the host commands the task needs are present (a missing one is a blocker; with NODE_AGENT_SLICE_INSTALL_DEPENDENCIES the pinned packages providing them are installed first)",
		"host_passthrough_check":   "the accelerator works and, with slots, /dev/kvm and the vfio-pci driver are there",
		"vfio_bind_check":          "bind the slots' GPUs and fabric VFs to vfio-pci; their IOMMU groups hold no host driver",
		"image_stat_download":      "find or fetch the image",
		"image_digest_verify":      "check the image's digest",
		"cloud_init_dir":           "create the VM's cloud-init directory",
		"terminal_key":             "create the VM's terminal key",
		"guest_telemetry_register": "register the guest for telemetry (collected over the brokered SSH after readiness, then on the agent's interval)",
		"cloud_init_seed_files":    "write the cloud-init seed files",
		"cloud_localds":            "build the seed ISO (in Go, no cloud-localds)",
		"runtime_validate":         "validate the VM spec with the runtime",
		"dhcp_reservation":         "write the VM's DHCP reservation",
		"image_write_convert":      "write the image to the boot NVMe (qemu-img convert)",
		"virt_install":             "start the VM through the runtime (QEMU, no virt-install)",
		"readiness":                "wait for the runtime's Ready and the guest's readiness; pin the host key, collect the first guest telemetry",
		"performance_probe":        "probe the VM's performance: the runtime's figures and a bounded probe in the guest over SSH (CPU loop, memory and disk throughput, GPUs visible)",
		"cleanup_vm":               "destroy the VM if it was defined",
		"cleanup_dhcp":             "drop the DHCP reservation this task wrote",
		"cleanup_telemetry":        "unregister telemetry this task registered",
		"cleanup_leases":           "release the leases this task took",
		"cleanup_cloud_init_dir":   "remove the cloud-init directory",
		"shutdown":                 "shut the VM down (graceful, then hard)",
		"undefine":                 "remove the VM from the runtime",
		"vfio_rebind":              "make sure the GPUs and fabric VFs are bound to vfio-pci again",
		"remove_cloud_init_dir":    "remove the cloud-init directory",
		"drop_dhcp_reservation":    "drop the DHCP reservation",
		"wipe":                     "zero the NVMe namespaces (only with params.wipe)",
		"release_leases":           "release the VM's leases",
		"unregister_telemetry":     "unregister the guest's telemetry",
	}
}
