package chaos

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// restartAgent stops drover-agent and starts it again with edit applied to
// its configuration (nil: unchanged), without waiting for health.
func (c *cluster) restartAgent(edit func(env map[string]string)) {
	c.t.Helper()
	c.agent.stop()
	if edit != nil {
		edit(c.agentEnv)
	}
	c.agent = startProc(c.t, filepath.Join(c.dir, "agent.log"), c.env(), c.bins.agent)
}

func mustRun(c *cluster, name string, args ...string) {
	c.t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		c.t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// allocUser is the OS user of the cluster's allocation.
func (c *cluster) allocUser() string {
	var a api.Allocation
	c.call(http.MethodGet, "/api/v1/allocations/"+c.allocID, nil, &a)
	return a.Username
}

// scenarios is the matrix: docs/runbooks/chaos.md explains each row.
func scenarios() []scenario {
	return []scenario{
		{name: "agent_stopped", injection: "kill drover-agent (SIGTERM)",
			hop: signal.HopNodeHeartbeat, sig: signal.HeartbeatStale,
			inject: func(c *cluster, _ *state) { c.agent.stop() },
			repair: func(c *cluster, _ *state) { c.restartAgent(nil) },
			limit:  3*heartbeat + time.Second},
		{name: "node_api_unreachable", injection: "API proxy listener closed (connection refused)",
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.APIUnreachable,
			inject: func(c *cluster, _ *state) { c.api.set(modeRefuse, 0, nil) },
			repair: func(c *cluster, _ *state) { c.api.set(modePass, 0, nil) }},
		{name: "node_api_blackholed", injection: "API proxy accepts and never forwards (egress dropped)",
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.APIUnreachable,
			inject: func(c *cluster, _ *state) { c.api.set(modeBlackhole, 0, nil) },
			repair: func(c *cluster, _ *state) { c.api.set(modePass, 0, nil) }},
		{name: "node_api_dns_broken", injection: "agent restarted with NODE_AGENT_CONTROL_PLANE_URL at a .invalid name",
			detail: "no such host",
			hop:    signal.HopNodeRuntimeAPIReachability, sig: signal.APIUnreachable,
			inject: func(c *cluster, s *state) {
				s.vals["url"] = c.agentEnv["NODE_AGENT_CONTROL_PLANE_URL"]
				c.restartAgent(func(env map[string]string) {
					env["NODE_AGENT_CONTROL_PLANE_URL"] = "https://drover-api.chaos.invalid:" + portOf(c.api.addr)
				})
			},
			repair: func(c *cluster, s *state) {
				c.restartAgent(func(env map[string]string) { env["NODE_AGENT_CONTROL_PLANE_URL"] = s.vals["url"] })
			}},
		{name: "stale_ca_bundle", injection: "API proxy presents a certificate of another CA",
			detail: "unknown authority",
			hop:    signal.HopNodeRuntimeAPIReachability, sig: signal.APITLSFailed,
			inject: func(c *cluster, _ *state) { c.api.set(modeTLS, 0, newOtherCA(c.t).serverTLS(false)) },
			repair: func(c *cluster, _ *state) { c.api.set(modePass, 0, nil) }},
		{name: "node_identity_superseded", injection: "rotate-token (API) and enrol a clone with it: the agent's certificate is superseded; repair: rotate-token, remove the node's identity.json, restart the agent with the token",
			detail: "node_identity_superseded",
			hop:    signal.HopNodeRecoveryStatus, sig: signal.AuthFailed, alt: []signal.Hop{signal.HopNodeRuntimeAPIReachability},
			inject: func(c *cluster, _ *state) { c.enrolClone() },
			// Without node-side hops the host's auth_failed status names it
			// at node_recovery_status.
			during: func(c *cluster, _ *state) string {
				r := c.operatorPreflight()
				cl := r.rep.Classification
				if cl.Hop != signal.HopNodeRecoveryStatus || cl.Signal != signal.AuthFailed {
					c.t.Errorf("preflight without node-side hops: %s/%s (%s), want node_recovery_status/node_agent_auth_failed",
						cl.Hop, cl.Signal, r.hopDetail())
				}
				return fmt.Sprintf("without --node-local: %s / %s", cl.Hop, cl.Signal)
			},
			// Re-enrolment: a fresh bootstrap token through the API, the
			// node's refused identity removed, the agent restarted with it.
			repair: func(c *cluster, _ *state) {
				var bt api.BootstrapToken
				c.call(http.MethodPost, "/api/v1/hosts/"+c.hostID+"/rotate-token", nil, &bt)
				c.agent.stop()
				if err := os.Remove(filepath.Join(c.agentEnv["NODE_AGENT_STATE_DIR"], "identity.json")); err != nil {
					c.t.Fatal(err)
				}
				c.restartAgent(func(env map[string]string) { env["NODE_AGENT_BOOTSTRAP_TOKEN"] = bt.Token })
			}},
		{name: "disk_pressure", injection: "state dir on a 4 MiB tmpfs filled to ~95% (threshold 90%)",
			detail: "threshold 90%",
			hop:    signal.HopNodeReadiness, sig: signal.DiskPressure,
			setup: func(c *cluster, _ *state) {
				dir := c.agentEnv["NODE_AGENT_STATE_DIR"]
				mustRun(c, "mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", dir)
				c.t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
				c.agentEnv["NODE_AGENT_DISK_PRESSURE_PERCENT"] = "90"
			},
			inject: func(c *cluster, _ *state) {
				f := filepath.Join(c.agentEnv["NODE_AGENT_STATE_DIR"], "chaos-filler")
				if err := os.WriteFile(f, make([]byte, 3900<<10), 0o600); err != nil {
					c.t.Fatal(err)
				}
			},
			repair: func(c *cluster, _ *state) {
				if err := os.Remove(filepath.Join(c.agentEnv["NODE_AGENT_STATE_DIR"], "chaos-filler")); err != nil {
					c.t.Fatal(err)
				}
			}},
		{name: "result_post_blocked", injection: "a terminal.open is claimed (its node stream slowed by the terminal proxy), then the API proxy refuses: the result post fails and is spooled",
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.APIUnreachable, terminal: true,
			inject: func(c *cluster, s *state) { s.vals["task"] = c.blockAfterClaim() },
			during: func(c *cluster, _ *state) string { return c.waitSpooled() },
			repair: func(c *cluster, _ *state) { c.api.set(modePass, 0, nil) },
			check:  func(c *cluster, s *state) { c.waitTask(s.vals["task"]) }},
		{name: "incompatible_binary", injection: "--agent-binary is the linux/arm64 build",
			detail: "exec format error",
			hop:    signal.HopNodeReadiness, sig: signal.BinaryInvalid,
			inject: func(c *cluster, s *state) { s.agentBin = c.bins.agentARM64 },
			repair: func(c *cluster, s *state) { s.agentBin = c.bins.agent }},
		{name: "node_cert_rotated", injection: "--cert-ttl 6s: the agent renews its certificate while preflight runs",
			noFault: true, opts: clusterOpts{certTTL: 6 * time.Second},
			inject: func(c *cluster, _ *state) {},
			check:  func(c *cluster, s *state) { c.preflightThroughRenewal(s) }},
		{name: "terminal_route_missing", injection: "--terminal-base at a listener without /healthz (404)",
			detail: "HTTP 404",
			hop:    signal.HopTerminalPublicRoute, sig: signal.PublicRouteMissing, terminal: true,
			inject: func(c *cluster, s *state) {
				edge := httptest.NewServer(http.NotFoundHandler())
				c.t.Cleanup(edge.Close)
				s.vals["edge"] = edge.URL
			},
			args:   func(_ *cluster, s *state) []string { return []string{"--terminal-base", s.vals["edge"]} },
			repair: func(_ *cluster, s *state) { delete(s.vals, "edge") }},
		{name: "gateway_upgrade_stripped", injection: "--terminal-base through an edge proxy that strips the WebSocket upgrade headers (Upgrade, Connection)",
			detail: "instead of a WebSocket upgrade",
			hop:    signal.HopBrowserTerminalWS, sig: signal.GatewayUpgradeFailed, terminal: true,
			inject: func(c *cluster, s *state) {
				target, err := url.Parse(c.opURL)
				if err != nil {
					c.t.Fatal(err)
				}
				// An edge without WebSocket support: /healthz passes, the
				// terminal upgrade reaches the gateway as a plain GET.
				edge := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
					r.SetURL(target)
					r.Out.Header.Del("Upgrade")
					r.Out.Header.Del("Connection")
				}})
				c.t.Cleanup(edge.Close)
				s.vals["edge"] = edge.URL
			},
			args:   func(_ *cluster, s *state) []string { return []string{"--terminal-base", s.vals["edge"]} },
			repair: func(_ *cluster, s *state) { delete(s.vals, "edge") }},
		{name: "node_terminal_blocked", injection: "terminal proxy listener closed",
			hop: signal.HopNodeTerminalReachability, sig: signal.NodeStreamTimeout, terminal: true,
			inject: func(c *cluster, _ *state) { c.term.set(modeRefuse, 0, nil) },
			repair: func(c *cluster, _ *state) { c.term.set(modePass, 0, nil) },
			limit:  streamTimeout + time.Second},
		{name: "node_stream_delayed", injection: "terminal proxy delays each connection 2x the gateway's node-stream timeout",
			hop: signal.HopNodeTerminalReachability, sig: signal.NodeStreamTimeout, terminal: true,
			alt:    []signal.Hop{signal.HopWorkloadTerminalStartup},
			inject: func(c *cluster, _ *state) { c.term.set(modeDelay, 2*streamTimeout, nil) },
			during: func(c *cluster, _ *state) string { return c.consoleShowsError(terminal.CodeNodeStreamTimeout) },
			repair: func(c *cluster, _ *state) { c.term.set(modePass, 0, nil) },
			limit:  streamTimeout + time.Second},
		{name: "terminal_profile_drift", injection: "agent restarted with NODE_AGENT_TERMINAL_URL at a closed port; the host's profile names the terminal proxy",
			hop: signal.HopNodeTerminalReachability, sig: signal.EnvProfileDrift, terminal: true,
			inject: func(c *cluster, _ *state) {
				c.restartAgent(func(env map[string]string) { env["NODE_AGENT_TERMINAL_URL"] = "https://" + freeAddr(c.t) })
			},
			limit: 3*heartbeat + streamTimeout,
			repair: func(c *cluster, _ *state) {
				c.restartAgent(func(env map[string]string) { env["NODE_AGENT_TERMINAL_URL"] = "https://" + c.term.addr })
			}},
		{name: "gateway_rejects_node_cert", injection: "terminal proxy terminates TLS and demands a client certificate of another CA",
			hop: signal.HopNodeTerminalReachability, sig: signal.NodeStreamMTLSFailed, terminal: true,
			alt: []signal.Hop{signal.HopWorkloadTerminalStartup},
			setup: func(c *cluster, s *state) {
				o := newOtherCA(c.t)
				var ca struct {
					PEM string `json:"ca_pem"`
				}
				c.call(http.MethodGet, "/api/v1/ca", nil, &ca)
				f := filepath.Join(c.dir, "ca-bundle.pem")
				if err := os.WriteFile(f, append([]byte(ca.PEM), o.pem...), 0o644); err != nil {
					c.t.Fatal(err)
				}
				c.agentEnv["NODE_AGENT_CA_FILE"] = f
				s.vals["ca"] = "set"
				c.otherCA = &o
			},
			inject: func(c *cluster, _ *state) { c.term.set(modeTLS, 0, c.otherCA.serverTLS(true)) },
			repair: func(c *cluster, _ *state) { c.term.set(modePass, 0, nil) },
			limit:  streamTimeout + time.Second},
		{name: "session_store_stopped", injection: "control plane on PostgreSQL; PostgreSQL stopped (fast shutdown), then started again",
			detail: "HTTP 500",
			// The session binding lives in the control plane's store: with
			// it down every operator call fails first (HTTP 500), so the
			// run stops at allocation_binding and cannot be stored; the
			// evidence is the error envelope's and the log's correlation id.
			hop: signal.HopAllocationBinding, sig: signal.ControlPlaneFailed, terminal: true, storeDown: true,
			opts: clusterOpts{postgres: true},
			inject: func(c *cluster, _ *state) {
				if err := c.pg.Halt(); err != nil {
					c.t.Fatal(err)
				}
			},
			repair: func(c *cluster, _ *state) {
				if err := c.pg.Resume(); err != nil {
					c.t.Fatal(err)
				}
			}},
		{name: "allocation_user_removed", injection: "userdel the allocation's OS user before open",
			detail: "does not exist",
			hop:    signal.HopWorkloadTerminalStartup, sig: signal.PTYFailed, terminal: true,
			inject: func(c *cluster, _ *state) {
				// The baseline smoke session's login shell ends after the
				// preflight returned: the gateway closes the node stream
				// once the CLI closed its WebSocket, then the agent hangs
				// up the shell's process group and reaps it.
				user := c.allocUser()
				c.waitUserProcsGone(user, userProcsGrace)
				mustRun(c, "userdel", "-r", user)
			},
			repair: func(c *cluster, _ *state) {
				old := c.allocID
				c.call(http.MethodDelete, "/api/v1/allocations/"+old, nil, nil)
				c.createAllocation("chy" + strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 10))
			},
			limit: streamTimeout + time.Second},
		{name: "pty_shell_missing", injection: "usermod -s /nonexistent/shell on the allocation's user; repair: its shell back",
			hop: signal.HopWorkloadTerminalStartup, sig: signal.PTYFailed, terminal: true,
			inject: func(c *cluster, s *state) {
				s.vals["user"] = c.allocUser()
				out, err := exec.Command("getent", "passwd", s.vals["user"]).Output()
				fields := strings.Split(strings.TrimSpace(string(out)), ":")
				if err != nil || len(fields) != 7 {
					c.t.Fatalf("getent passwd %s: %v: %q", s.vals["user"], err, out)
				}
				s.vals["shell"] = fields[6]
				mustRun(c, "usermod", "-s", "/nonexistent/shell", s.vals["user"])
			},
			repair: func(c *cluster, s *state) { mustRun(c, "usermod", "-s", s.vals["shell"], s.vals["user"]) },
			limit:  streamTimeout + time.Second},
	}
}

func portOf(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	return addr[i+1:]
}
