package agent

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/agent/statedir"
	"github.com/drover-dev/drover/internal/node/probe"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// PreflightOptions are `drover-agent preflight`'s own flags.
type PreflightOptions struct {
	// Timeout bounds each hop (default 10s).
	Timeout time.Duration
	// RuntimeAPIURL replaces the control plane URL; RuntimeResolveAddress
	// is dialled instead of resolving its host.
	RuntimeAPIURL, RuntimeResolveAddress string
	// TerminalURL replaces the terminal URL; TerminalResolveAddress is
	// dialled instead of resolving its host.
	TerminalURL, TerminalResolveAddress string
	// Progress, when set, is told each hop and step as it runs.
	Progress io.Writer
}

// nodeCreds are what the node-side hops dial with: the trusted roots (or
// the pinned CA check before enrolment) and the node's certificate.
type nodeCreds struct {
	nodeID      string
	tls         *tls.Config
	enrolled    bool
	profileTerm string // the terminal URL the control plane gave at enrolment
}

// Preflight runs the node-side preflight hops (node_readiness,
// node_runtime_api_reachability, node_terminal_reachability) with cfg's
// state dir and identity. It changes nothing but a probe file it removes.
func Preflight(ctx context.Context, cfg Config, o PreflightOptions) preflight.NodeReport {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	progress := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, format+"\n", args...)
		}
	}
	rep := preflight.NodeReport{Schema: preflight.SchemaVersion, AgentVersion: Version, GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}
	creds, credErr := loadCreds(cfg)
	rep.NodeID = creds.nodeID
	hop := func(h signal.Hop, fn func(ctx context.Context, r *preflight.HopResult)) {
		progress("%s ...", h)
		hctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		r := preflight.HopResult{Hop: h, Status: preflight.Passed}
		start := time.Now()
		fn(hctx, &r)
		r.DurationMS = time.Since(start).Milliseconds()
		progress("%s %s (%d ms) %s", h, r.Status, r.DurationMS, r.Detail)
		rep.Hops = append(rep.Hops, r)
	}
	hop(signal.HopNodeReadiness, func(_ context.Context, r *preflight.HopResult) { nodeReadiness(cfg, r) })
	stepProgress := func(step string) { progress("  %s", step) }
	hop(signal.HopNodeRuntimeAPIReachability, func(ctx context.Context, r *preflight.HopResult) {
		if credErr != nil {
			r.Fail(signal.AuthFailed, "node credentials: "+credErr.Error())
			return
		}
		runtimeAPIHop(ctx, cfg, o, creds, r, stepProgress)
	})
	hop(signal.HopNodeTerminalReachability, func(ctx context.Context, r *preflight.HopResult) {
		if credErr != nil {
			r.Fail(signal.NodeStreamMTLSFailed, "node credentials: "+credErr.Error())
			return
		}
		terminalHop(ctx, cfg, o, creds, r, stepProgress)
	})
	return rep
}

// loadCreds reads the node's identity from the state dir: its certificate
// and CA bundle; before enrolment, the configured CA file or pin.
func loadCreds(cfg Config) (nodeCreds, error) {
	c := nodeCreds{nodeID: cfg.HostID, tls: &tls.Config{MinVersion: tls.VersionTLS12}}
	dir, err := statedir.Open(cfg.StateDir)
	if err != nil {
		return c, fmt.Errorf("state dir: %w", err)
	}
	if c.nodeID, err = dir.NodeID(cfg.HostID); err != nil {
		return c, fmt.Errorf("node id: %w", err)
	}
	id, ok, err := dir.LoadIdentity()
	if err != nil {
		return c, fmt.Errorf("load identity: %w", err)
	}
	if ok {
		cert, err := tls.X509KeyPair(id.CertPEM, id.KeyPEM)
		if err != nil {
			return c, fmt.Errorf("node certificate: %w", err)
		}
		c.tls.Certificates, c.enrolled, c.profileTerm = []tls.Certificate{cert}, true, id.TerminalURL
		if len(id.CAPEM) > 0 {
			c.tls.RootCAs = x509.NewCertPool()
			c.tls.RootCAs.AppendCertsFromPEM(id.CAPEM)
		}
	}
	switch {
	case cfg.CAFile != "":
		if c.tls.RootCAs, err = caPoolFromFile(cfg.CAFile); err != nil {
			return c, fmt.Errorf("NODE_AGENT_CA_FILE: %w", err)
		}
	case c.tls.RootCAs == nil && cfg.CAHash != "":
		c.tls.InsecureSkipVerify = true // replaced by the pinned-CA check
		c.tls.VerifyPeerCertificate = pki.PinnedVerify(cfg.CAHash, hostOf(cfg.ControlPlaneURL))
	case c.tls.RootCAs == nil:
		return c, errors.New("no CA bundle: not enrolled and neither NODE_AGENT_CA_FILE nor NODE_AGENT_CA_HASH is set")
	}
	return c, nil
}

// nodeReadiness checks filesystem usage of / and of the state dir, that the
// state dir takes a write, and that the binary matches the host.
func nodeReadiness(cfg Config, r *preflight.HopResult) {
	th := cfg.diskPressurePercent()
	r.Data = map[string]any{"state_dir": cfg.StateDir, "disk_pressure_percent": th}
	var fails []struct {
		sig    signal.Name
		detail string
	}
	fail := func(n signal.Name, d string) {
		fails = append(fails, struct {
			sig    signal.Name
			detail string
		}{n, d})
	}
	var notes []string
	root := string(filepath.Separator)
	if v := filepath.VolumeName(cfg.StateDir); v != "" {
		root = v + root
	}
	for _, fs := range []struct{ name, path string }{{"root", root}, {"state", cfg.StateDir}} {
		u, err := probe.Usage(fs.path)
		if err != nil {
			notes = append(notes, err.Error())
			continue
		}
		pct := roundPercent(u.UsedPercent)
		r.Data[fs.name+"_used_percent"] = pct
		r.Data[fs.name+"_free_bytes"] = u.FreeBytes
		switch {
		case u.UsedPercent >= 100 || (u.TotalBytes > 0 && u.FreeBytes == 0):
			fail(signal.DiskFull, fmt.Sprintf("%s filesystem (%s) is full: %s used", fs.name, fs.path, formatPercent(pct)))
		case u.UsedPercent >= float64(th):
			fail(signal.DiskPressure, fmt.Sprintf("%s filesystem (%s) %s used, threshold %d%%", fs.name, fs.path, formatPercent(pct), th))
		default:
			notes = append(notes, fmt.Sprintf("%s %s used", fs.path, formatPercent(pct)))
		}
	}
	if err := probe.Writable(cfg.StateDir); err != nil {
		if probe.IsDiskFull(err) {
			fail(signal.DiskFull, "diagnostic path not writable: "+err.Error())
		} else {
			fail(signal.ProcessDown, "diagnostic path not writable: "+err.Error())
		}
		r.Data["state_dir_writable"] = false
	} else {
		r.Data["state_dir_writable"] = true
	}
	ok, arch := probe.BinaryMatchesHost()
	r.Data["binary"] = arch
	if !ok {
		fail(signal.BinaryInvalid, arch)
	}
	if len(fails) == 0 {
		r.Detail = strings.Join(append(notes, "state dir writable", arch), "; ")
		return
	}
	// The most severe first: a full disk, then the binary, then pressure.
	best := fails[0]
	for _, f := range fails {
		if rank(f.sig) < rank(best.sig) {
			best = f
		}
	}
	var all []string
	for _, f := range fails {
		all = append(all, f.detail)
	}
	r.Fail(best.sig, strings.Join(all, "; "))
}

func rank(n signal.Name) int {
	switch n {
	case signal.DiskFull:
		return 0
	case signal.BinaryInvalid:
		return 1
	case signal.ProcessDown:
		return 2
	}
	return 3
}

// runtimeAPIHop: DNS, TCP, TLS to the control plane's node API, then GET
// the node's JWKS with its certificate (no side effects; tasks/wait would
// claim a task).
func runtimeAPIHop(ctx context.Context, cfg Config, o PreflightOptions, c nodeCreds, r *preflight.HopResult, progress func(string)) {
	raw := cfg.ControlPlaneURL
	if o.RuntimeAPIURL != "" {
		raw = o.RuntimeAPIURL
	}
	u, err := parseHTTPS(raw)
	if err != nil {
		r.Fail(signal.APIUnreachable, "runtime API URL: "+err.Error())
		return
	}
	ep := probe.Endpoint{URL: u, ResolveAddress: o.RuntimeResolveAddress, TLS: c.tls}
	ch := probe.CheckEndpoint(ctx, ep, nodeapi.JWKS.Path(c.nodeID), progress)
	r.Data = ch.Data()
	r.Data["url"] = u.String()
	if ch.Err != nil {
		f, _ := probe.Classify(ch.Err, ch.Target)
		r.Fail(f.Signal, f.Detail)
		return
	}
	if ch.Status != http.StatusOK {
		f, ok := probe.Classify(answerError(ch.Status, ch.Body), ch.Target)
		if !ok {
			f.Signal, f.Detail = signal.BinaryInvalid, fmt.Sprintf("unexpected answer from %s: %d", ch.Target, ch.Status)
		}
		if !c.enrolled && f.Signal == signal.AuthFailed {
			f.Detail = "not enrolled yet (no node certificate): " + f.Detail
		}
		r.Fail(f.Signal, f.Detail)
		return
	}
	var jwks api.JWKS
	if err := json.Unmarshal(ch.Body, &jwks); err != nil {
		r.Fail(signal.BinaryInvalid, fmt.Sprintf("%s answered the JWKS route with something else: %v", ch.Target, err))
		return
	}
	r.Detail = fmt.Sprintf("DNS, TCP (%s), TLS and mTLS to %s; node route answered with %d task-signing keys", ch.Address, ch.Target, len(jwks.Keys))
}

// terminalHop: DNS, TCP, TLS with the node certificate to the node-facing
// terminal URL, then a plain GET of the terminal stream route for a made-up
// session, which the gateway answers 404 terminal_session_unknown: routing
// and mTLS proven, nothing opened.
func terminalHop(ctx context.Context, cfg Config, o PreflightOptions, c nodeCreds, r *preflight.HopResult, progress func(string)) {
	raw := cfg.terminalURL()
	if o.TerminalURL != "" {
		raw = o.TerminalURL
	}
	u, err := parseHTTPS(raw)
	if err != nil {
		r.Fail(signal.EnvProfileDrift, "terminal URL: "+err.Error())
		return
	}
	sid := "preflight-" + randomHex(8)
	ep := probe.Endpoint{URL: u, ResolveAddress: o.TerminalResolveAddress, TLS: c.tls}
	ch := probe.CheckEndpoint(ctx, ep, nodeapi.TerminalStream.Path(c.nodeID, sid), progress)
	r.Data = ch.Data()
	r.Data["url"], r.Data["session_id"] = u.String(), sid
	if c.profileTerm != "" {
		r.Data["profile_terminal_url"] = c.profileTerm
	}
	if ch.Err != nil {
		f, _ := probe.Classify(ch.Err, ch.Target)
		switch f.Kind {
		case probe.KindTLS, probe.KindClientCert:
			r.Fail(signal.NodeStreamMTLSFailed, f.Detail)
		default:
			r.Fail(signal.NodeStreamTimeout, f.Detail)
		}
		return
	}
	var eb api.ErrorBody
	_ = json.Unmarshal(ch.Body, &eb)
	switch {
	case (ch.Status == http.StatusNotFound && eb.Error.Code == "terminal_session_unknown") || ch.Status == http.StatusGone:
		r.Detail = fmt.Sprintf("DNS, TCP (%s), TLS and mTLS to %s; the gateway answered %d %s for a made-up session", ch.Address, ch.Target, ch.Status, eb.Error.Code)
	case ch.Status == http.StatusUnauthorized || ch.Status == http.StatusForbidden:
		r.Fail(signal.NodeStreamMTLSFailed, fmt.Sprintf("%s refused the node certificate: %d %s %s", ch.Target, ch.Status, eb.Error.Code, eb.Error.Message))
	case ch.Status >= 500:
		r.Fail(signal.NodeStreamTimeout, fmt.Sprintf("%s answered %d %s", ch.Target, ch.Status, eb.Error.Code))
	default:
		r.Fail(signal.EnvProfileDrift, fmt.Sprintf("%s is not the terminal gateway's node-facing route: GET %s answered %d %s",
			ch.Target, nodeapi.TerminalStream.Pattern(), ch.Status, eb.Error.Code))
	}
}

// answerError is an HTTP answer as the node API client reports it.
func answerError(status int, body []byte) error {
	e := &nodeapi.Error{Status: status, Body: string(body)}
	var eb api.ErrorBody
	if json.Unmarshal(body, &eb) == nil {
		e.Code, e.Message = eb.Error.Code, eb.Error.Message
	}
	return e
}

func parseHTTPS(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%q: must be an https:// URL", raw)
	}
	return u, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
