package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/postgres"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/node/runtime/qemu"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// pg is the PostgreSQL server shared by this test binary (nil when the
// binaries are missing outside CI).
var (
	pg    *pgtest.Server
	pgErr error
)

func TestMain(m *testing.M) {
	accel.MaybeRunChild() // agents' KVM probes re-execute this binary
	pg, pgErr = pgtest.StartServer()
	code := m.Run()
	if pg != nil {
		pg.Stop()
	}
	// The binaries built once for the whole test binary.
	for _, bin := range []string{droverBin, agentBin, armBin} {
		if bin != "" {
			os.RemoveAll(filepath.Dir(bin))
		}
	}
	os.Exit(code)
}

// backend opens a fresh store of one kind.
type backend struct {
	name string
	open func(t *testing.T) store.Store
}

// backends are the two store adapters every integration test runs against.
func backends() []backend {
	return []backend{
		{"sqlite", func(t *testing.T) store.Store { return openSQLite(t) }},
		{"postgres", openPostgres},
	}
}

func openSQLite(t testing.TB) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "drover.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func openPostgres(t *testing.T) store.Store {
	t.Helper()
	if pg == nil {
		pgtest.Skip(t, pgErr)
	}
	return openPostgresDSN(t, pg.NewDatabase(t))
}

func openPostgresDSN(t *testing.T, dsn string) store.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// env is one control-plane replica on loopback plus helpers to drive it.
type env struct {
	t       testing.TB
	st      store.Store
	srv     *server.Server
	opURL   string
	nodeURL string
	opToken string
	// opHTTP calls the operator API. Under a short idle timeout it opens a
	// connection per request: a reused keep-alive connection can be closed
	// by the server's idle timer just as a request is written on it, and a
	// POST that was written is not retried (EOF).
	opHTTP *http.Client
	stop   func()
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("DROVER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// harnessHeartbeat is the heartbeat interval replicas tell agents, and so
// the liveness window: a host is stale after three missed intervals. It is
// wide enough that a loaded CI machine (QEMU guests, Chromium and the race
// detector on two cores) cannot stall a healthy agent into stale; tests of
// staleness itself use fastLiveness. The harness's agents beat every 100ms.
const harnessHeartbeat = time.Second

// fastLiveness makes hosts go stale after 600ms, for tests that wait for it.
func fastLiveness(c *server.Config) { c.HeartbeatInterval = 200 * time.Millisecond }

// startEnv starts a replica on st with ports chosen by the kernel.
func startEnv(t testing.TB, st store.Store, mutate ...func(*server.Config)) *env {
	t.Helper()
	return startEnvAt(t, st, "127.0.0.1:0", "127.0.0.1:0", mutate...)
}

// startEnvAt is startEnv on the given operator and node addresses (a
// control plane restarted where its agents and clients expect it).
func startEnvAt(t testing.TB, st store.Store, opAddr, nodeAddr string, mutate ...func(*server.Config)) *env {
	t.Helper()
	opLn, err := net.Listen("tcp", opAddr)
	if err != nil {
		t.Fatal(err)
	}
	nodeLn, err := net.Listen("tcp", nodeAddr)
	if err != nil {
		t.Fatal(err)
	}
	nodeURL := "https://" + nodeLn.Addr().String()
	cfg := server.Config{OperatorAddr: opLn.Addr().String(), NodeAddr: nodeLn.Addr().String(), NodeURL: nodeURL,
		HeartbeatInterval: harnessHeartbeat, MaxWait: 5 * time.Second, Logger: testLogger(t), KEK: testKEK()}
	for _, m := range mutate {
		m(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, cfg, st)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, opLn, nodeLn) }()
	<-srv.Ready()
	e := &env{t: t, st: st, srv: srv, opURL: "http://" + opLn.Addr().String(), nodeURL: nodeURL, opHTTP: http.DefaultClient}
	if cfg.IdleTimeout > 0 && cfg.IdleTimeout < 5*time.Second {
		e.opHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	}
	e.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server stopped with error: %v", err)
		}
	}
	t.Cleanup(func() {
		if e.stop != nil {
			e.stop()
		}
	})
	// Token names are unique and replicas share a store: the first replica's
	// token is "test", the others' are named by their port.
	tok, err := srv.CreateOperatorToken(ctx, server.OperatorTokenSpec{Name: "test", Role: api.RoleAdmin})
	if errors.Is(err, store.ErrConflict) {
		tok, err = srv.CreateOperatorToken(ctx, server.OperatorTokenSpec{Name: "test-" + opLn.Addr().String(),
			Role: api.RoleAdmin})
	}
	if errors.Is(err, store.ErrConflict) { // a restart on the same address
		tok, err = srv.CreateOperatorToken(ctx, server.OperatorTokenSpec{
			Name: fmt.Sprintf("test-%s-%d", opLn.Addr(), time.Now().UnixNano()), Role: api.RoleAdmin})
	}
	if err != nil {
		t.Fatal(err)
	}
	e.opToken = tok.Token
	return e
}

// op calls the operator API and decodes the answer into out; it returns the
// HTTP status.
func (e *env) op(method, path string, in, out any) int {
	e.t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.opURL+path, body)
	req.Header.Set("Authorization", "Bearer "+e.opToken)
	resp, err := e.opHTTP.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if b, ok := out.(*[]byte); ok { // raw bodies (recordings)
		*b = raw
		return resp.StatusCode
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			e.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode
}

// createHost makes a host record and returns its bootstrap token.
func (e *env) createHost(id string) api.BootstrapToken {
	e.t.Helper()
	var bt api.BootstrapToken
	if st := e.op(http.MethodPost, "/api/v1/hosts", api.CreateHostRequest{HostID: id, OSFamily: "linux"}, &bt); st != http.StatusCreated {
		e.t.Fatalf("create host %s: HTTP %d", id, st)
	}
	return bt
}

// enqueue queues a task and returns it.
func (e *env) enqueue(node, typ string, params any) api.Task {
	e.t.Helper()
	raw, _ := json.Marshal(params)
	var t api.Task
	if st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: node, Type: typ, Params: raw}, &t); st != http.StatusCreated {
		e.t.Fatalf("enqueue %s for %s: HTTP %d", typ, node, st)
	}
	return t
}

// waitTask waits until the task is terminal.
func (e *env) waitTask(id string, within time.Duration) api.Task {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var t api.Task
		if st := e.op(http.MethodGet, "/api/v1/tasks/"+id+"?wait=2s", nil, &t); st != http.StatusOK {
			e.t.Fatalf("get task %s: HTTP %d", id, st)
		}
		if t.State.Terminal() {
			return t
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("task %s still %s after %s", id, t.State, within)
		}
	}
}

// agentOpts tweak an in-process agent.
type agentOpts struct {
	stateDir string
	handlers agent.Handlers
	url      string
	accel    string // NODE_AGENT_QEMU_ACCEL
	fallback string // NODE_AGENT_ACCEL_FALLBACK
	// realProbe runs the real accelerator probe (a KVM guest in a child
	// process) instead of a fixture where only tcg works.
	realProbe bool
	// probe replaces the fixture probe (where only tcg works).
	probe func(context.Context) (accel.Result, error)
	// Instances: runtime is NODE_AGENT_RUNTIME ("" = none); rt injects one
	// (the mock); imageDirs and runtimeDir as the agent's config keys.
	runtime    string
	rt         runtime.Runtime
	imageDirs  string
	runtimeDir string
	// settings are runtime-owned keys (NODE_AGENT_QEMU_MICROVM_KERNEL);
	// allowLocal is NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS.
	settings   map[string]string
	allowLocal bool
	// tune edits the agent's configuration last (restart policy, ...).
	tune func(*agent.Config)
	// options are more agent options (agent.WithSliceHost).
	options []agent.Option
}

// fixedAccel is an accelerator probe reporting only the named ones working.
func fixedAccel(working ...string) func(context.Context) (accel.Result, error) {
	return func(context.Context) (accel.Result, error) {
		var r accel.Result
		for _, n := range accel.Names() {
			st := accel.Status{Name: n, Reason: "test_fixture", Detail: "fixture"}
			if slices.Contains(working, n) {
				st.Works, st.Reason = true, accel.ReasonOK
				r.Working = append(r.Working, n)
			}
			r.Accelerators = append(r.Accelerators, st)
		}
		return r, nil
	}
}

// startAgent runs an in-process agent until the test ends or stop is called.
func (e *env) startAgent(hostID, token string, o agentOpts) (a *agent.Agent, stop func()) {
	e.t.Helper()
	if o.stateDir == "" {
		o.stateDir = e.t.TempDir()
	}
	if o.url == "" {
		o.url = e.nodeURL
	}
	if _, ok := o.settings["NODE_AGENT_QEMU_CGROUP_PARENT"]; !ok {
		// No host memory cgroups from tests (a test that wants them names
		// a parent of its own and removes it).
		s := map[string]string{"NODE_AGENT_QEMU_CGROUP_PARENT": "none"}
		for k, v := range o.settings {
			s[k] = v
		}
		o.settings = s
	}
	cfg := agent.Config{ControlPlaneURL: o.url, HostID: hostID, BootstrapToken: token, CAHash: e.srv.CAHash(),
		OSFamily: "linux", StateDir: o.stateDir, ListenAddr: "127.0.0.1:0", HeartbeatInterval: 100 * time.Millisecond,
		QEMUAccel: o.accel, AccelFallback: o.fallback, Runtime: o.runtime, ImageDirs: o.imageDirs, RuntimeDir: o.runtimeDir,
		ReconcileInterval: 200 * time.Millisecond,
		Runtimes:          runtime.Registry{qemu.Name: qemu.Entry(), mock.Name: mock.Entry()},
		RuntimeSettings:   o.settings, ImageAllowLocalURLs: o.allowLocal}
	if cfg.Runtime == "" && o.rt == nil {
		cfg.Runtime = agent.RuntimeNone
	}
	if o.tune != nil {
		o.tune(&cfg)
	}
	opts := []agent.Option{agent.WithLogger(testLogger(e.t).With("agent", hostID))}
	switch {
	case o.probe != nil:
		opts = append(opts, agent.WithAccelProbe(o.probe))
	case !o.realProbe:
		opts = append(opts, agent.WithAccelProbe(fixedAccel(accel.TCG)))
	}
	if o.handlers != nil {
		opts = append(opts, agent.WithHandlers(o.handlers))
	}
	opts = append(opts, o.options...)
	if o.rt != nil {
		opts = append(opts, agent.WithRuntime(o.rt))
	}
	a, err := agent.New(cfg, opts...)
	if err != nil {
		e.t.Fatalf("agent.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once bool
	stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		if err := <-done; err != nil {
			e.t.Logf("agent %s stopped: %v", hostID, err)
		}
	}
	e.t.Cleanup(stop)
	return a, stop
}

// waitHostStatus waits for a host to reach a status.
func (e *env) waitHostStatus(id string, want api.HostStatus, within time.Duration) api.Host {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var h api.Host
		e.op(http.MethodGet, "/api/v1/hosts/"+id, nil, &h)
		if h.Status == want {
			return h
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("host %s status %s, want %s after %s", id, h.Status, want, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeIdentity is a raw enrolled identity for negative tests.
type nodeIdentity struct {
	id     string
	cert   tls.Certificate
	client *http.Client
}

// rawClient returns an HTTP client trusting the control plane's CA and,
// when cert is non-nil, presenting it.
func (e *env) rawClient(cert *tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.srv.CAPEM())
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}, Timeout: 20 * time.Second}
}

// register posts a register request and returns status and body.
func (e *env) register(req api.RegisterRequest) (int, []byte, http.Header) {
	e.t.Helper()
	b, _ := json.Marshal(req)
	resp, err := e.rawClient(nil).Post(e.nodeURL+"/internal/v1/register", "application/json", bytes.NewReader(b))
	if err != nil {
		e.t.Fatalf("register: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, resp.Header
}

func validCaps() api.Capabilities {
	return api.Capabilities{Hostname: "h", OSFamily: "linux", Arch: "amd64", CPUCores: 2, RAMTotalMB: 2048}
}

// enroll enrols hostID with token by hand and returns an mTLS identity.
func (e *env) enroll(hostID, token string) nodeIdentity {
	e.t.Helper()
	p := e.enrollPEM(hostID, token)
	cert, err := tls.X509KeyPair(p.cert, p.key)
	if err != nil {
		e.t.Fatal(err)
	}
	return nodeIdentity{id: hostID, cert: cert, client: e.rawClient(&cert)}
}

// nodeCall calls a node route with an identity; it returns status, error
// code and body.
func (e *env) nodeCall(c *http.Client, method, path string, in any) (int, string, []byte) {
	e.t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.nodeURL+path, body)
	resp, err := c.Do(req)
	if err != nil {
		return 0, "transport: " + err.Error(), nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var eb api.ErrorBody
	_ = json.Unmarshal(raw, &eb)
	return resp.StatusCode, eb.Error.Code, raw
}

func nodePath(id, rest string) string { return fmt.Sprintf("/internal/v1/nodes/%s%s", id, rest) }

// auditHas reports whether an audit record matches action, target and result.
func (e *env) auditHas(action, target, result string) bool {
	var evs []api.AuditEvent
	e.op(http.MethodGet, "/api/v1/audit?limit=1000&target="+target, nil, &evs)
	for _, ev := range evs {
		if ev.Action == action && (result == "" || ev.Result == result) {
			return true
		}
	}
	return false
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

type storeHost = store.Host
