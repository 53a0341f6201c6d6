package agent_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// stubTLS serves h over TLS with a certificate from ca for 127.0.0.1,
// verifying client certificates from clientCA when given (required when
// require is set).
func stubTLS(t *testing.T, ca, clientCA *pki.CA, require bool, h http.Handler) string {
	t.Helper()
	cert, err := ca.ServerCertificate([]string{"127.0.0.1"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	if clientCA != nil {
		srv.TLS.ClientAuth, srv.TLS.ClientCAs = tls.VerifyClientCertIfGiven, clientCA.Pool()
		if require {
			srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

// terminalGateway answers the node terminal stream route like the real
// gateway does for a session it does not know: 404 terminal_session_unknown
// (after checking the node certificate).
func terminalGateway(t *testing.T, f *fakeCP) string {
	mux := http.NewServeMux()
	mux.HandleFunc(nodeapi.TerminalStream.MuxPattern(), f.nodeAuth(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "terminal_session_unknown", "no terminal session "+r.PathValue("session_id"))
	}))
	return stubTLS(t, f.ca, f.ca, false, mux)
}

func answer(status int, code string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if code == "" {
			w.WriteHeader(status)
			return
		}
		writeError(w, status, code, code)
	})
}

func closedAddr(t *testing.T) string {
	t.Helper()
	// Port 1 (tcpmux), which no test binds. A port freed by closing a
	// listener could be taken again at once by the next listener of this
	// or a parallel test: the "refused" case then reached a stub answering
	// 404 (a flake seen in CI).
	const addr = "127.0.0.1:1"
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("something listens on %s; this test needs a closed port there", addr)
	}
	return addr
}

// TestPreflight runs the node-side hops of an enrolled agent against the
// fake control plane and a terminal gateway: all pass; then each broken
// path fails its hop with its signal.
func TestPreflight(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	dir := t.TempDir()
	startAgent(t, f, dir, (&counter{}).handlers()).stop(t)
	other := newFakeCP(t) // another CA
	otherCA := other.ca
	term := terminalGateway(t, f)
	cpPort := f.srv.URL[strings.LastIndex(f.srv.URL, ":")+1:]
	hop := map[signal.Hop]int{signal.HopNodeReadiness: 0, signal.HopNodeRuntimeAPIReachability: 1, signal.HopNodeTerminalReachability: 2}
	for _, tc := range []struct {
		name     string
		pressure int
		opts     agent.PreflightOptions
		hop      signal.Hop // "" when all pass
		sig      signal.Name
		detail   string
	}{
		{name: "all pass"},
		{name: "resolve address keeps SNI", opts: agent.PreflightOptions{RuntimeAPIURL: "https://127.0.0.1:" + cpPort, RuntimeResolveAddress: "127.0.0.1"}},
		{name: "disk pressure", pressure: 1, hop: signal.HopNodeReadiness, sig: signal.DiskPressure, detail: "threshold 1%"},
		{name: "dns", opts: agent.PreflightOptions{RuntimeAPIURL: "https://drover-preflight.invalid:8443"},
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.APIUnreachable, detail: "dns: drover-preflight.invalid:8443"},
		{name: "refused via resolve address", opts: agent.PreflightOptions{RuntimeResolveAddress: closedAddr(t)},
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.APIUnreachable, detail: "refused: "},
		{name: "wrong CA", opts: agent.PreflightOptions{RuntimeAPIURL: other.srv.URL},
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.APITLSFailed, detail: "tls: "},
		{name: "mTLS rejected", opts: agent.PreflightOptions{RuntimeAPIURL: stubTLS(t, f.ca, otherCA, true, answer(200, ""))},
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.AuthFailed, detail: "client_cert: "},
		{name: "revoked", opts: agent.PreflightOptions{RuntimeAPIURL: stubTLS(t, f.ca, f.ca, false, answer(403, "node_identity_revoked"))},
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.AuthFailed, detail: "identity revoked"},
		{name: "rate limited", opts: agent.PreflightOptions{RuntimeAPIURL: stubTLS(t, f.ca, f.ca, false, answer(429, "rate_limited"))},
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.EdgeRateLimited, detail: "rate_limited: "},
		{name: "no node route", opts: agent.PreflightOptions{RuntimeAPIURL: stubTLS(t, f.ca, f.ca, false, http.NotFoundHandler())},
			hop: signal.HopNodeRuntimeAPIReachability, sig: signal.BinaryInvalid, detail: "protocol: "},
		{name: "terminal unreachable", opts: agent.PreflightOptions{TerminalResolveAddress: closedAddr(t)},
			hop: signal.HopNodeTerminalReachability, sig: signal.NodeStreamTimeout, detail: "refused: "},
		{name: "terminal mTLS rejected", opts: agent.PreflightOptions{TerminalURL: stubTLS(t, f.ca, otherCA, true, answer(404, "terminal_session_unknown"))},
			hop: signal.HopNodeTerminalReachability, sig: signal.NodeStreamMTLSFailed, detail: "client_cert: "},
		{name: "terminal URL is not the gateway", opts: agent.PreflightOptions{TerminalURL: stubTLS(t, f.ca, f.ca, false, http.NotFoundHandler())},
			hop: signal.HopNodeTerminalReachability, sig: signal.EnvProfileDrift, detail: "not the terminal gateway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(f, dir)
			cfg.TerminalURL, cfg.DiskPressurePercent = term, tc.pressure
			tc.opts.Timeout = 5 * time.Second
			var progress bytes.Buffer
			tc.opts.Progress = &progress
			rep := agent.Preflight(context.Background(), cfg, tc.opts)
			if rep.Schema != preflight.SchemaVersion || rep.NodeID != testNodeID || len(rep.Hops) != 3 {
				t.Fatalf("report %+v", rep)
			}
			for i, h := range rep.Hops {
				want := preflight.Passed
				if tc.hop != "" && hop[tc.hop] == i {
					want = preflight.Failed
				}
				if h.Status != want && !(tc.hop != "" && i > hop[tc.hop]) {
					t.Errorf("hop %s: %s %s %q; want %s", h.Hop, h.Status, h.Signal, h.Detail, want)
				}
			}
			if tc.hop == "" {
				if d := rep.Hops[1].Data; d["address"] == nil || d["tls_ms"] == nil {
					t.Errorf("runtime hop data %v", d)
				}
				return
			}
			h := rep.Hops[hop[tc.hop]]
			if h.Signal != tc.sig || !strings.Contains(h.Detail, tc.detail) || h.Owner == "" || h.Recovery == "" {
				t.Errorf("hop %s: signal %s detail %q owner %q; want %s with %q", h.Hop, h.Signal, h.Detail, h.Owner, tc.sig, tc.detail)
			}
			if !strings.Contains(progress.String(), string(tc.hop)+" failed") {
				t.Errorf("progress does not name the failed hop:\n%s", progress.String())
			}
		})
	}
}

// TestPreflightDiskFull: a state dir on a full filesystem fails
// node_readiness with disk_full.
func TestPreflightDiskFull(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	cfg := testConfig(f, testutil.FullTmpfs(t, "64k"))
	rep := agent.Preflight(context.Background(), cfg, agent.PreflightOptions{Timeout: 2 * time.Second})
	if h := rep.Hops[0]; h.Status != preflight.Failed || h.Signal != signal.DiskFull || h.Data["state_dir_writable"] != false {
		t.Errorf("node_readiness on a full filesystem: %+v", h)
	}
}

// TestPreflightCommand: the subcommand prints the JSON report, exits 1 on a
// failure and 0 when all pass, and --help prints usage without acting.
func TestPreflightCommand(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	dir := t.TempDir()
	startAgent(t, f, dir, (&counter{}).handlers()).stop(t)
	term := terminalGateway(t, f)
	noEnv := func(string) string { return "" }
	base := []string{"-control-plane-url", f.srv.URL, "-ca-hash", f.ca.Hash(), "-host-id", testNodeID, "-state-dir", dir, "-runtime", "none"}
	var out, errOut bytes.Buffer
	code := agent.PreflightCommand(context.Background(), append([]string{"--json", "--terminal-url", term, "--timeout", "5s"}, base...), noEnv, nil, &out, &errOut)
	var rep preflight.NodeReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || code != 0 || len(rep.Hops) != 3 {
		t.Fatalf("exit %d, report %s (%v)\nstderr: %s", code, out.String(), err, errOut.String())
	}
	if !strings.Contains(errOut.String(), string(signal.HopNodeTerminalReachability)+" passed") {
		t.Errorf("no progress on stderr: %s", errOut.String())
	}
	out.Reset()
	code = agent.PreflightCommand(context.Background(), append([]string{"--terminal-url", term, "--runtime-resolve-address", closedAddr(t)}, base...), noEnv, nil, &out, &errOut)
	if code != 1 || !strings.Contains(out.String(), string(signal.APIUnreachable)) || !strings.Contains(out.String(), "first failure: "+string(signal.HopNodeRuntimeAPIReachability)) {
		t.Errorf("exit %d, table:\n%s", code, out.String())
	}
	out.Reset()
	fresh := t.TempDir() + "/never"
	code = agent.PreflightCommand(context.Background(), []string{"--help", "-state-dir", fresh}, noEnv, nil, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "--runtime-resolve-address") {
		t.Errorf("--help: exit %d\n%s", code, out.String())
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("--help acted: it made the state dir %s (%v)", fresh, err)
	}
}

// TestStatusCommand: `drover-agent status` prints the running agent's
// status (exit 0 when ok), the document with --json, and exits 1 with the
// signal when there is a problem or no agent answers.
func TestStatusCommand(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	r := startAgent(t, f, t.TempDir(), (&counter{}).handlers())
	addr, err := r.LocalAddr(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	getenv := func(k string) string {
		if k == "NODE_AGENT_LISTEN" {
			return addr.String()
		}
		return ""
	}
	var out, errOut bytes.Buffer
	eventually(t, "status ok", func() bool {
		out.Reset()
		return agent.StatusCommand(context.Background(), nil, getenv, nil, &out, &errOut) == 0
	})
	if !strings.Contains(out.String(), "status:") || !strings.Contains(out.String(), "spooled results:") {
		t.Errorf("summary:\n%s", out.String())
	}
	f.setHeartbeatStatus(func(int) int { return http.StatusForbidden })
	eventually(t, "status naming auth_failed", func() bool {
		out.Reset()
		code := agent.StatusCommand(context.Background(), []string{"--json"}, getenv, nil, &out, &errOut)
		var st agent.Status
		return code == 1 && json.Unmarshal(out.Bytes(), &st) == nil && st.Signal == signal.AuthFailed
	})
	closed := func(k string) string {
		if k == "NODE_AGENT_LISTEN" {
			return closedAddr(t)
		}
		return ""
	}
	errOut.Reset()
	if code := agent.StatusCommand(context.Background(), nil, closed, nil, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), string(signal.ProcessDown)) {
		t.Errorf("no agent: exit %d, %s", code, errOut.String())
	}
}
