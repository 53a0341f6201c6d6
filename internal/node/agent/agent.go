// Package agent is drover-agent: it enrols the host with a bootstrap token,
// keeps an mTLS identity renewed, heartbeats, long-polls for signed tasks,
// verifies every envelope before running a registered handler, and posts
// structured results from a crash-safe on-disk spool. It serves a small
// local API (/healthz, /v1/capacity, /metrics). It never runs anything that
// is not a registered handler: the only shells it starts are the terminal
// sessions that signed terminal.open tasks ask for (internal/node/termnode).
package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent/statedir"
	"github.com/drover-dev/drover/internal/node/hostinfo"
	"github.com/drover-dev/drover/internal/node/probe"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/version"
)

// Version is the agent version reported to the control plane (heartbeat,
// capabilities, preflight, status): the build's version from
// internal/wire/version, which releases set with -ldflags -X.
var Version = version.Short()

// Agent is one running node agent.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	now      func() time.Time
	state    *statedir.Dir
	nodeID   string
	handlers Handlers
	verifier *task.Verifier
	metrics  *metrics
	guests   *guestMetrics // slice guests' telemetry gauges
	reg      *prometheus.Registry

	bootstrap *client // first contact: pinned CA, no client certificate
	node      *client // mTLS with the current identity

	// diag holds the current problems and the recent diagnostic events,
	// logs the recent log lines (both bounded, served by diag.collect);
	// spooled counts the results waiting to be posted.
	diag    *diagnostics
	logs    *logRing
	spooled atomic.Int64

	mu        sync.Mutex
	ident     statedir.Identity
	disk      probe.DiskUsage // the state dir's filesystem, at the last check
	lastBeat  time.Time
	interval  time.Duration
	wakeSpool chan struct{}
	postMu    sync.Mutex // serialises result posts (postResult)
	postQueue struct {   // results waiting for postMu (postResult)
		sync.Mutex
		items []*queuedResult
	}
	noResultsRoute atomic.Bool // the control plane answered POST .../tasks/results with 404 or 405
	localAddr      net.Addr
	localReady     chan struct{}
	total          api.Capacity // host totals from the last inventory
	gpus           []api.GPU    // the GPUs of the last inventory (container GPU requests are checked against them)
	accel          accel.Result
	accelErr       string
	// pciNames keeps the PCI names of the host readings (every 5
	// minutes), so that pci.ids is parsed again only when it changed or a
	// new device appeared.
	pciNames hostinfo.PCINameCache
	// releaseMemory runs after each host reading (WithMemoryRelease).
	releaseMemory  func(*slog.Logger)
	probe          func(context.Context) (accel.Result, error)
	runtime        runtime.Runtime // injected (tests); else built from cfg.Runtime
	vms            *vmSide         // nil until Run built it, or with NODE_AGENT_RUNTIME=none
	customHandlers bool
	onReady        func() // WithReadyHook: called where systemd gets READY=1
	// sliceRoot and sliceDevDirs (WithSliceHost) are where the slice
	// tasks read the host's sysfs, procfs and devfs, and where slot NVMe
	// devices may lie ("" and nil: the real host, / and /dev).
	sliceRoot    string
	sliceDevDirs []string

	// jwksMu serialises JWKS refreshes on unknown kids and the JWKS a
	// certificate renewal brings (renew); jwksGen counts refreshes, so a
	// renewal whose request predates one keeps the refreshed keys rather
	// than its answer's older set; jwksRefreshedAt is
	// the last one's start (zero: none yet).
	jwksMu          sync.Mutex
	jwksRefreshedAt time.Time
	jwksGen         uint64
}

// Option customises an Agent.
type Option func(*Agent)

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.log = l } }

// WithClock sets the clock (tests).
func WithClock(now func() time.Time) Option { return func(a *Agent) { a.now = now } }

// WithMemoryRelease has the agent call release after each host reading (at
// start and every 5 minutes). drover-agent passes ReleaseMemory; an agent
// embedded in another process (`drover dev`, tests) leaves that process's
// memory alone.
func WithMemoryRelease(release func(*slog.Logger)) Option {
	return func(a *Agent) { a.releaseMemory = release }
}

// WithAccelProbe replaces the accelerator probe (tests use a fixed result;
// the real probe boots a KVM guest in a child process).
func WithAccelProbe(f func(context.Context) (accel.Result, error)) Option {
	return func(a *Agent) { a.probe = f }
}

// WithHandlers replaces the task handlers (tests add counting handlers).
// The VM task handlers are then not added.
func WithHandlers(h Handlers) Option {
	return func(a *Agent) { a.handlers, a.customHandlers = h, true }
}

// WithRuntime runs instances with rt instead of the configured runtime
// (tests pass the mock).
func WithRuntime(rt runtime.Runtime) Option { return func(a *Agent) { a.runtime = rt } }

// WithSliceHost makes the slice tasks (slice.topology_discover,
// slice.vm_provision, slice.vm_release) read the host's sys/, proc/ and
// dev/ below root and accept slot NVMe devices in deviceDirs (tests pass a
// fake GPU/NVMe/fabric tree built with hostinfotest).
func WithSliceHost(root string, deviceDirs ...string) Option {
	return func(a *Agent) { a.sliceRoot, a.sliceDevDirs = root, deviceDirs }
}

// New prepares an agent: it opens the state directory and settles the node
// id. It contacts nobody.
func New(cfg Config, opts ...Option) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: slog.Default(), now: time.Now, wakeSpool: make(chan struct{}, 1),
		localReady: make(chan struct{})}
	for _, o := range opts {
		o(a)
	}
	if r := cfg.hostRoot(); r != "" && a.sliceRoot == "" {
		a.sliceRoot, a.sliceDevDirs = r, []string{filepath.Join(r, "dev")}
	}
	var err error
	// Absolute, so handlers (e.g. the diagnostic path check) see a stable path.
	if a.cfg.StateDir, err = filepath.Abs(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	cfg = a.cfg
	if a.state, err = statedir.Open(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if a.nodeID, err = a.state.NodeID(cfg.HostID); err != nil {
		return nil, fmt.Errorf("node id: %w", err)
	}
	a.diag = newDiagnostics(a.now)
	a.logs = newLogRing(maxLogLines, maxLogBytes, cfg.BootstrapToken)
	a.log = slog.New(slog.NewMultiHandler(a.log.Handler(), slog.NewJSONHandler(a.logs, &slog.HandlerOptions{ReplaceAttr: redactAttr})))
	a.log = a.log.With("node_id", a.nodeID)
	a.cfg.HostID = a.nodeID // handlers derive per-host values (slot MACs) from it
	if a.handlers == nil {
		a.handlers = DefaultHandlers(a.cfg)
		if a.sliceRoot != "" {
			for typ, h := range sliceHandlersAt(a.cfg, a.sliceRoot) {
				a.handlers[typ] = h
			}
		}
		a.handlers[task.TypeCollect] = a.CollectHandler()
		a.handlers[task.TypeImagePull] = ImagePullHandler(a.imagePullRuntime, a.readSecret, time.Now)
		a.handlers[task.TypeVolumeList] = VolumeListHandler(a.volumeRuntime)
		a.handlers[task.TypeVolumeDelete] = VolumeDeleteHandler(a.volumeRuntime)
	}
	if a.probe == nil {
		p := accel.New(accel.Config{CacheDir: cfg.StateDir})
		a.probe = p.ProbeCached
	}
	a.reg = prometheus.NewRegistry()
	a.metrics = newMetrics(a.reg)
	a.guests = newGuestMetrics(a.reg)
	return a, nil
}

// NodeID is the agent's node id.
func (a *Agent) NodeID() string { return a.nodeID }

// LocalAddr waits for the local API listener and returns its address.
func (a *Agent) LocalAddr(ctx context.Context) (net.Addr, error) {
	select {
	case <-a.localReady:
		return a.localAddr, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Run enrols (or loads the stored identity) and runs every loop until ctx
// ends. Liveness (heartbeats), work (task polling), renewal and result
// delivery are separate loops so one stalled hop cannot starve another.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.setupClients(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", a.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("local API listener %s: %w", a.cfg.ListenAddr, err)
	}
	a.localAddr = ln.Addr()
	close(a.localReady)

	a.probeAccelerators(ctx)
	vms, err := a.buildRuntime(ctx)
	if err != nil {
		// The host still enrols, heartbeats and runs tasks; it just runs no
		// instances (e.g. no QEMU or no working accelerator on this host).
		a.log.Error("instance runtime unavailable; this host runs no instances", "runtime", a.cfg.Runtime, "err", err)
		vms = nil
	}
	if vms != nil {
		a.mu.Lock()
		a.vms = vms
		a.mu.Unlock()
		if !a.customHandlers {
			for typ, h := range VMHandlers(vms.slices) {
				a.handlers[typ] = h
			}
			for typ, h := range guestAllocHandlers(a.handlers, vms.slices) {
				a.handlers[typ] = h
			}
		}
		go guestTelemetryLoop(ctx, vms.slices, a.guests, a.cfg.sliceTelemetryInterval(), a.log)
	}

	if !a.customHandlers {
		// Terminal sessions outlive their terminal.open task; they end
		// when the agent stops.
		term := a.newTerminalManager()
		defer term.Close()
		for typ, h := range TerminalHandlers(term) {
			a.handlers[typ] = h
		}
		logs := a.newLogsManager()
		defer logs.Close()
		for typ, h := range LogsHandlers(logs) {
			a.handlers[typ] = h
		}
	}

	a.spoolInterrupted()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.serveLocal(gctx, ln) })
	g.Go(func() error {
		id, err := a.identity(gctx)
		if err != nil {
			return err
		}
		if err := a.applyIdentity(id); err != nil {
			return err
		}
		a.log.Info("agent running", "control_plane", a.cfg.ControlPlaneURL, "cert_not_after", id.NotAfter)
		lg, lctx := errgroup.WithContext(gctx)
		lg.Go(func() error { return a.heartbeatLoop(lctx) })
		lg.Go(func() error { return a.taskLoop(lctx) })
		lg.Go(func() error { return a.resultLoop(lctx) })
		lg.Go(func() error { return a.renewLoop(lctx) })
		lg.Go(func() error { return a.capabilitiesLoop(lctx) })
		lg.Go(func() error { return a.notifyLoop(lctx) }) // sd_notify: READY=1, watchdog, STOPPING=1
		if vms != nil {
			lg.Go(func() error { return a.runVMs(lctx, vms) })
		}
		return lg.Wait()
	})
	err = g.Wait()
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// setupClients builds the first-contact and mTLS clients.
func (a *Agent) setupClients() error {
	var roots *x509.CertPool
	if id, ok, err := a.state.LoadIdentity(); err == nil && ok && len(id.CAPEM) > 0 {
		roots = x509.NewCertPool()
		roots.AppendCertsFromPEM(id.CAPEM)
	} else if err != nil {
		return fmt.Errorf("load identity: %w", err)
	}
	var err error
	if a.cfg.CAFile != "" {
		if roots, err = caPoolFromFile(a.cfg.CAFile); err != nil {
			return fmt.Errorf("NODE_AGENT_CA_FILE: %w", err)
		}
	}
	if roots != nil {
		a.bootstrap, err = newClient(a.cfg.ControlPlaneURL, roots, nil)
	} else {
		host := hostOf(a.cfg.ControlPlaneURL)
		a.bootstrap, err = newClient(a.cfg.ControlPlaneURL, nil, pki.PinnedVerify(a.cfg.CAHash, host))
	}
	if err != nil {
		return err
	}
	return nil
}

// probeAccelerators finds which accelerators really work (cached per boot)
// and checks NODE_AGENT_QEMU_ACCEL against them. A selection the host cannot
// run is logged as `selected_accel not supported by host` and reported with
// the capabilities, which makes the host unschedulable; the agent keeps
// running so the control plane can show why.
func (a *Agent) probeAccelerators(ctx context.Context) {
	res, err := a.probe(ctx)
	var cacheErr *accel.CacheError
	if err != nil && !errors.As(err, &cacheErr) {
		a.log.Error("accelerator probe", "err", err)
	} else if err != nil {
		a.log.Warn("accelerator probe result not cached", "err", err)
	}
	for _, st := range res.Accelerators {
		a.log.Info("accelerator", "name", st.Name, "works", st.Works, "reason", st.Reason, "duration_ms", st.DurationMS)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.accel = res
	if a.cfg.QEMUAccel == "" {
		a.cfg.QEMUAccel = accel.Default(res)
		return
	}
	if err := accel.Select(res, a.cfg.QEMUAccel); err != nil {
		if fb := a.cfg.AccelFallback; fb != "" && accel.Select(res, fb) == nil {
			a.log.Warn(err.Error()+"; falling back to "+fb+" (NODE_AGENT_ACCEL_FALLBACK)",
				"selected_accel", a.cfg.QEMUAccel, "fallback", fb, "working", res.Working)
			a.cfg.QEMUAccel = fb
			return
		}
		a.accelErr = err.Error()
		a.log.Error(a.accelErr, "selected_accel", a.cfg.QEMUAccel, "working", res.Working)
	}
}

// redactAttr masks log attributes whose key names a credential, before
// they reach the log ring.
func redactAttr(_ []string, at slog.Attr) slog.Attr {
	if secretKey(at.Key) && at.Value.Kind() != slog.KindGroup {
		return slog.String(at.Key, redacted)
	}
	return at
}
