// Package preflight is the operator side of `drover preflight`: it walks
// the hops of internal/wire/signal in order against the operator API, the
// browser-facing terminal gateway and (over SSH, or locally with
// --node-local) `drover-agent preflight` on the node, stops at the first
// failed hop, and returns an internal/wire/preflight Report naming the hop,
// its signal and the owner of the repair. The kong command that parses the
// flags and prints the report is internal/cli/preflight.go.
package preflight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os/user"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// DefaultHeartbeatInterval is the control plane's default heartbeat
// interval (drover server --heartbeat-interval); the operator API does not
// show the configured one, so a last_seen older than four of these (three
// missed beats and one coalesced flush) counts as stale.
const DefaultHeartbeatInterval = 5 * time.Second

// Config is one run's inputs.
type Config struct {
	APIBase      string // the operator API, e.g. http://127.0.0.1:8080
	Token        string // operator bearer token
	TerminalBase string // the browser-facing terminal gateway; default APIBase
	AllocationID string
	NodeID       string
	// Node-side hops: over SSH to NodeHost, or locally when NodeLocal.
	NodeHost, NodeUser string
	NodeLocal          bool
	AgentBinary        string // drover-agent on the node
	SSHKey             string // private key file; "" uses the SSH agent
	SSHKnownHosts      string
	SSHPort            int
	// Explicit node-facing endpoints and resolve targets, passed to
	// drover-agent preflight.
	NodeRuntimeAPIURL, NodeRuntimeResolveAddress string
	NodeTerminalURL, NodeTerminalResolveAddress  string
	RunWSSmoke                                   bool
	Timeout                                      time.Duration // per hop
	HeartbeatInterval                            time.Duration // default DefaultHeartbeatInterval
	HTTPClient                                   *http.Client  // default: a plain client
	// Progress, when set, is called as each hop finishes, in order.
	Progress func(preflight.HopResult)
	// Warn, when set, receives warnings (the report could not be stored).
	Warn func(string)
	Now  func() time.Time
}

// UsageError is a problem with the flags; the command exits 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Validate checks the flag combinations and fills defaults.
func (c *Config) Validate() error {
	bad := func(f string, a ...any) error { return &UsageError{Msg: fmt.Sprintf(f, a...)} }
	if c.APIBase == "" {
		return bad("--api-base (or --api) is required")
	}
	for name, v := range map[string]string{"--api-base": c.APIBase, "--terminal-base": c.TerminalBase,
		"--node-runtime-api-url": c.NodeRuntimeAPIURL, "--node-terminal-url": c.NodeTerminalURL} {
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("%s %q: must be an http(s) URL", name, v)
		}
	}
	if c.AllocationID == "" && c.NodeID == "" {
		return bad("pass --node-id, --allocation-id or both")
	}
	if c.RunWSSmoke && c.AllocationID == "" {
		return bad("--run-ws-smoke needs --allocation-id (the session is opened for an allocation)")
	}
	if c.NodeLocal && c.NodeHost != "" {
		return bad("--node-local and --node-host exclude each other")
	}
	if c.Timeout <= 0 {
		return bad("--timeout must be positive")
	}
	if c.SSHPort < 0 || c.SSHPort > 65535 {
		return bad("--ssh-port %d: out of range", c.SSHPort)
	}
	c.APIBase = strings.TrimRight(c.APIBase, "/")
	if c.TerminalBase == "" {
		c.TerminalBase = c.APIBase
	}
	c.TerminalBase = strings.TrimRight(c.TerminalBase, "/")
	if c.NodeUser == "" && c.NodeHost != "" {
		u, err := user.Current()
		if err != nil {
			return bad("--node-user is required: %v", err)
		}
		c.NodeUser = u.Username
	}
	if c.AgentBinary == "" {
		c.AgentBinary = "drover-agent"
	}
	if c.SSHPort == 0 {
		c.SSHPort = 22
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// run is one preflight run's state, filled hop by hop.
type run struct {
	cfg    Config
	api    *apiClient
	report *preflight.Report

	alloc      *api.Allocation
	host       *api.Host
	nodeRaw    []byte // drover-agent preflight's stdout
	nodeErr    error  // why no node report came back
	nodeExit   int    // drover-agent preflight's exit status, when it exited
	nodeReport *preflight.NodeReport
	token      *api.TerminalToken
	ws         *wsSession
}

// Run runs the hops and returns the report; it stores the report with the
// control plane (POST /api/v1/preflight-runs) and warns when that fails.
// The error is a UsageError or nil: hop failures are in the report.
func Run(ctx context.Context, cfg Config) (*preflight.Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cid := newCorrelationID()
	r := &run{cfg: cfg, api: &apiClient{base: cfg.APIBase, token: cfg.Token, cid: cid, http: cfg.HTTPClient},
		report: &preflight.Report{Schema: preflight.SchemaVersion, CorrelationID: cid, StartedAt: cfg.Now().UTC(),
			NodeID: cfg.NodeID, AllocationID: cfg.AllocationID, Inputs: cfg.inputs()}}
	defer r.closeSession()
	r.walk(ctx)
	r.report.FinishedAt = cfg.Now().UTC()
	r.store(ctx)
	return r.report, nil
}

// inputs are the run's flags for the report, never credentials.
func (c Config) inputs() map[string]string {
	in := map[string]string{"api_base": c.APIBase, "terminal_base": c.TerminalBase}
	for k, v := range map[string]string{"node_host": c.NodeHost, "node_user": c.NodeUser,
		"node_runtime_api_url": c.NodeRuntimeAPIURL, "node_runtime_resolve_address": c.NodeRuntimeResolveAddress,
		"node_terminal_url": c.NodeTerminalURL, "node_terminal_resolve_address": c.NodeTerminalResolveAddress} {
		if v != "" {
			in[k] = v
		}
	}
	if c.NodeLocal {
		in["node_local"] = "true"
	}
	if c.RunWSSmoke {
		in["run_ws_smoke"] = "true"
	}
	in["timeout"] = c.Timeout.String()
	return in
}

func newCorrelationID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return "pfl_" + hex.EncodeToString(b[:])
}

// hopFunc checks one hop, setting res (Passed when it leaves Status empty).
type hopFunc func(ctx context.Context, res *preflight.HopResult)

func (r *run) hopFuncs() map[signal.Hop]hopFunc {
	return map[signal.Hop]hopFunc{
		signal.HopAllocationBinding:          r.allocationBinding,
		signal.HopNodeHeartbeat:              r.nodeHeartbeat,
		signal.HopNodeOpsAccess:              r.nodeOpsAccess,
		signal.HopNodeReadiness:              r.nodeHop(signal.HopNodeReadiness),
		signal.HopNodeRuntimeAPIReachability: r.nodeHop(signal.HopNodeRuntimeAPIReachability),
		signal.HopNodeRecoveryStatus:         r.nodeRecoveryStatus,
		signal.HopTerminalTokenMint:          r.terminalTokenMint,
		signal.HopTerminalPublicRoute:        r.terminalPublicRoute,
		signal.HopBrowserTerminalWS:          r.browserTerminalWS,
		signal.HopWorkloadTerminalStartup:    r.workloadTerminalStartup,
		signal.HopNodeTerminalReachability:   r.nodeHop(signal.HopNodeTerminalReachability),
		signal.HopGatewayNodeStream:          r.gatewayNodeStream,
	}
}

// walk runs the hops in signal.Hops() order, stopping at the first failure.
func (r *run) walk(ctx context.Context) {
	fns := r.hopFuncs()
	var failed signal.Hop
	for _, info := range signal.Hops() {
		res := preflight.HopResult{Hop: info.Hop}
		switch {
		case info.Hop == signal.HopClassification:
			r.classify(&res)
		case failed != "" && !r.rootCauseAfter(failed, info.Hop):
			res.Status, res.Detail = preflight.Skipped, "after failed hop "+string(failed)
		default:
			fn := fns[info.Hop]
			start := time.Now()
			hctx, cancel := context.WithTimeout(ctx, r.hopTimeout(info.Hop))
			fn(hctx, &res)
			cancel()
			if res.DurationMS == 0 {
				res.DurationMS = time.Since(start).Milliseconds()
			}
			if res.Status == "" {
				res.Status = preflight.Passed
			}
			if res.Status == preflight.Failed && failed == "" {
				failed = info.Hop
			}
		}
		r.report.Hops = append(r.report.Hops, res)
		if r.cfg.Progress != nil {
			r.cfg.Progress(res)
		}
	}
}

// rootCauseAfter says whether hop still runs after failed: a
// terminal_node_stream_timeout at workload_terminal_startup_failure is most
// often the node's own path to the terminal URL, which the node already
// reported, so node_terminal_reachability is shown when it failed.
func (r *run) rootCauseAfter(failed, hop signal.Hop) bool {
	if failed != signal.HopWorkloadTerminalStartup || hop != signal.HopNodeTerminalReachability {
		return false
	}
	if last := r.hopResult(failed); last == nil || last.Signal != signal.NodeStreamTimeout {
		return false
	}
	h := r.nodeHopResult(signal.HopNodeTerminalReachability)
	return h != nil && h.Status == preflight.Failed
}

func (r *run) hopResult(h signal.Hop) *preflight.HopResult {
	for i := range r.report.Hops {
		if r.report.Hops[i].Hop == h {
			return &r.report.Hops[i]
		}
	}
	return nil
}

// classify fills final_classification and Report.Classification: the first
// failed hop, or node_terminal_reachability when it explains a
// terminal_node_stream_timeout.
func (r *run) classify(res *preflight.HopResult) {
	r.report.Classify()
	c := &r.report.Classification
	if c.Hop == signal.HopWorkloadTerminalStartup && c.Signal == signal.NodeStreamTimeout {
		if h := r.hopResult(signal.HopNodeTerminalReachability); h != nil && h.Status == preflight.Failed {
			*c = preflight.Classification{Hop: h.Hop, Signal: h.Signal, Owner: h.Owner, Recovery: h.Recovery}
		}
	}
	if c.OK {
		res.Status, res.Detail = preflight.Passed, "every hop that ran passed"
		return
	}
	res.Status, res.Signal, res.Owner, res.Recovery = preflight.Failed, c.Signal, c.Owner, c.Recovery
	res.Detail = fmt.Sprintf("root cause: hop %s (%s)", c.Hop, c.Signal)
	res.Data = map[string]any{"failed_hop": string(c.Hop)}
}

// hopTimeout is the per-hop budget; the node-side run covers three probes
// and the terminal session's startup waits for frames one timeout apiece.
func (r *run) hopTimeout(h signal.Hop) time.Duration {
	switch h {
	case signal.HopNodeOpsAccess, signal.HopNodeReadiness:
		return 4*r.cfg.Timeout + 5*time.Second
	case signal.HopWorkloadTerminalStartup:
		return 4 * (r.cfg.Timeout + frameGrace)
	}
	return r.cfg.Timeout
}

// store posts the report to the control plane; a control plane that has no
// such route (404) or refuses it only earns a warning.
func (r *run) store(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	err := r.api.do(sctx, http.MethodPost, "/api/v1/preflight-runs", r.report, nil)
	switch {
	case err == nil:
	case statusOf(err) == http.StatusNotFound || statusOf(err) == http.StatusMethodNotAllowed:
		r.warn("control plane does not store preflight runs")
	default:
		r.warn("could not store the preflight report: " + err.Error())
	}
}

func (r *run) warn(msg string) {
	if r.cfg.Warn != nil {
		r.cfg.Warn(msg)
	}
}
