// Package server is the Drover control plane's assembly: Config, New,
// Serve/Run, and the operator (bearer tokens, loopback by default) and node
// (mTLS, every route bound to the caller's certificate) route tables that
// mount the handlers of its rooms (hosts, allocations, instances, tasks,
// termgw, audit, keys, operators, preflight, dashboard) and the listeners'
// limits. It owns no persistence of its own: all state is in the
// store.Store it is given, so several replicas can share one PostgreSQL
// database. It must not execute anything on behalf of nodes.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/drover-dev/drover/internal/cp/allocations"
	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/dashboard"
	"github.com/drover-dev/drover/internal/cp/healthsched"
	"github.com/drover-dev/drover/internal/cp/hosts"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/instances"
	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/keys"
	"github.com/drover-dev/drover/internal/cp/logsgw"
	"github.com/drover-dev/drover/internal/cp/operators"
	"github.com/drover-dev/drover/internal/cp/preflight"
	"github.com/drover-dev/drover/internal/cp/secrets"
	"github.com/drover-dev/drover/internal/cp/sliceflow"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/tasks"
	"github.com/drover-dev/drover/internal/cp/termgw"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Config configures a control-plane replica. Zero values take the defaults
// documented on each field.
type Config struct {
	// EvidenceCollectWait bounds how long an evidence bundle waits for the
	// agent's diag.collect (default 15 s).
	EvidenceCollectWait time.Duration
	// OperatorAddr is the operator API and UI listener (default 127.0.0.1:8080).
	OperatorAddr string
	// NodeAddr is the node-facing mTLS listener (default :8443).
	NodeAddr string
	// NodeURL is the URL agents use to reach NodeAddr, printed with bootstrap
	// tokens (default https://127.0.0.1:<port of NodeAddr>).
	NodeURL string
	// AdvertiseNodeURL is this replica's own node-facing base URL, reachable
	// by agents directly (not through a load balancer over the replicas):
	// terminal.open and logs.open carry it as their signed stream_url so a
	// node's stream reaches the replica holding the session. Its host is
	// added to the node listener certificate's names. "" (one replica):
	// stream_url is omitted and agents dial their configured URL.
	AdvertiseNodeURL string
	// PublicURL is the URL operators' browsers use for OperatorAddr when a
	// proxy in front of it terminates TLS (e.g. https://drover.example):
	// with https the dashboard's cookies are Secure on every request, and
	// its origin may open browser terminals. "" means browsers come to
	// OperatorAddr directly.
	PublicURL string
	// TLSHosts are extra DNS names or IPs for the node listener's certificate.
	TLSHosts []string
	// AllowUnknownHostRegistration lets an agent with an unknown host_id
	// enrol without a bootstrap token (dev only). It only ever creates a
	// host: a host id that has a record needs a valid bootstrap token.
	AllowUnknownHostRegistration bool
	// KEK encrypts the CA key and the task-signing keys at rest; New
	// encrypts plaintext ones in place and re-seals ones sealed with a
	// previous KEK of the ring. Nil refuses to start (ErrNoKEK) unless
	// InsecurePlaintextKeys.
	KEK *kek.Ring
	// InsecurePlaintextKeys lets a replica without a KEK keep private keys
	// in plaintext. Ignored when KEK is set.
	InsecurePlaintextKeys bool
	// CertTTL is the lifetime of node client certificates (default 24h).
	CertTTL time.Duration
	// CertReenrolGrace is how long after its expiry an agent's last
	// certificate still enrols it again, by proof of its key, without a
	// bootstrap token (ADR 0021; default 7 days, negative: never).
	CertReenrolGrace time.Duration
	// HeartbeatInterval is the interval agents are told to use (default 5s).
	// A host is stale after three missed intervals.
	HeartbeatInterval time.Duration
	// HealthProbeInterval is how often the control plane queues
	// diag.health_probe on every enabled, heartbeating host, each host in a
	// slot of its own spread over the interval (internal/cp/healthsched);
	// 0 (the zero value) disables the schedule. `drover serve` defaults it
	// to 10m. Finished probes update the hosts' health either way.
	HealthProbeInterval time.Duration
	// MaxWait caps a long-poll (default 30s).
	MaxWait time.Duration
	// LongPollFallback is how often the replica re-checks the task queue
	// for the claim long-polls parked on it, in case a change event was
	// lost (default 10s; negative disables it). Wake-ups normally come from
	// store events; after PostgreSQL's LISTEN connection reconnects every
	// long-poll is woken anyway.
	LongPollFallback time.Duration
	// ReadHeaderTimeout bounds reading a request's headers, and the TLS
	// handshake, on both listeners (default 10s).
	ReadHeaderTimeout time.Duration
	// BodyReadTimeout, added to ReadHeaderTimeout, bounds reading a whole
	// request (default 30s). Requests without a body (long-polls, WebSocket
	// upgrades) have no read deadline once their headers are in.
	BodyReadTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long (default 2m).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (default 64 KiB).
	MaxHeaderBytes int
	// NodeLongPollLimit is how many long-polls of one route (tasks/wait,
	// instances?wait=) a node may hold open on this replica (default 4);
	// beyond it: 429 node_long_poll_limit.
	NodeLongPollLimit int
	// VCPUAllocationRatio is how many instance vCPUs placement allows per
	// host CPU left after the reservation (default 4, OpenStack's initial
	// cpu_allocation_ratio). Memory, disk and GPUs are never overcommitted.
	VCPUAllocationRatio float64
	// BootstrapTokenTTL is the default bootstrap token lifetime (default 24h).
	BootstrapTokenTTL time.Duration
	// RegisterRate and RegisterBurst limit enrolment attempts per client IP
	// (default 5/s, burst 10).
	RegisterRate  rate.Limit
	RegisterBurst int
	// AuthFailRate and AuthFailBurst limit failed enrolments (unknown host,
	// wrong token) per client address and, separately, per host id (default
	// one per 30s, burst 10); past them registration answers 429.
	AuthFailRate  rate.Limit
	AuthFailBurst int
	// Terminal configures the browser terminal gateway.
	Terminal TerminalConfig
	// Logs configures the workload logs gateway (see logsgw.Config).
	Logs logsgw.Config
	// Registry lists the task types this control plane accepts (default
	// task.Builtin()).
	Registry *task.Registry
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// TerminalConfig configures the terminal gateway (see termgw.Config).
type TerminalConfig = termgw.Config

func (c *Config) setDefaults() error {
	if c.PublicURL != "" {
		origin, err := publicOrigin(c.PublicURL)
		if err != nil {
			return err
		}
		// A copy: the caller's slice is not appended to.
		c.Terminal.AllowedOrigins = append(slices.Clip(c.Terminal.AllowedOrigins), origin)
	}
	if c.AdvertiseNodeURL != "" {
		c.Terminal.AdvertiseURL, c.Logs.AdvertiseURL = c.AdvertiseNodeURL, c.AdvertiseNodeURL
		if u, err := url.Parse(c.AdvertiseNodeURL); err == nil && u.Hostname() != "" && !slices.Contains(c.TLSHosts, u.Hostname()) {
			c.TLSHosts = append(slices.Clip(c.TLSHosts), u.Hostname())
		}
	}
	if err := c.Terminal.SetDefaults(); err != nil {
		return err
	}
	c.defaultAddrs()
	if c.CertTTL == 0 {
		c.CertTTL = 24 * time.Hour
	}
	if c.CertReenrolGrace == 0 {
		c.CertReenrolGrace = 7 * 24 * time.Hour
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 5 * time.Second
	}
	if c.VCPUAllocationRatio == 0 {
		c.VCPUAllocationRatio = 4
	}
	if c.VCPUAllocationRatio < 1 {
		return fmt.Errorf("vCPU allocation ratio %g: must be at least 1", c.VCPUAllocationRatio)
	}
	if c.MaxWait == 0 {
		c.MaxWait = 30 * time.Second
	}
	if c.LongPollFallback == 0 {
		c.LongPollFallback = 10 * time.Second
	}
	if c.BootstrapTokenTTL == 0 {
		c.BootstrapTokenTTL = 24 * time.Hour
	}
	if c.RegisterRate == 0 {
		c.RegisterRate = 5
	}
	if c.RegisterBurst == 0 {
		c.RegisterBurst = 10
	}
	if err := c.setLimitDefaults(); err != nil {
		return err
	}
	if c.AuthFailRate == 0 {
		c.AuthFailRate = rate.Every(30 * time.Second)
	}
	if c.AuthFailBurst == 0 {
		c.AuthFailBurst = 10
	}
	if c.Registry == nil {
		r, err := task.NewRegistry(task.Builtin()...)
		if err != nil {
			return err
		}
		c.Registry = r
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Errors New returns when the private keys cannot be used (see keys).
var (
	ErrNoKEK       = keys.ErrNoKEK
	ErrKEKMismatch = keys.ErrKEKMismatch
)

// SealAtRest encrypts every private key, workload secret and dashboard
// session's operator token in st with ring's primary KEK (see
// keys.SealAtRest, keys.SealWorkloadSecrets and dashboard.ResealSessions):
// `drover keys rotate-kek` runs it offline.
func SealAtRest(ctx context.Context, st store.Store, ring *kek.Ring, log *slog.Logger) (int, error) {
	n, err := keys.SealAtRest(ctx, st, ring, log)
	if err != nil {
		return n, err
	}
	m, err := keys.SealWorkloadSecrets(ctx, st, ring, log)
	if err != nil {
		return n + m, err
	}
	d, err := dashboard.ResealSessions(ctx, st, ring, log)
	return n + m + d, err
}

// Server is one control-plane replica.
type Server struct {
	cfg   Config
	store store.Store
	log   *slog.Logger
	audit *audit.Log
	ca    *pki.CA
	keys  *keys.Keys
	// hosts is the hosts room (enrolment, node auth, liveness).
	hosts *hosts.Room
	// inst is the instances room (placement, the desired-set long-polls).
	inst *instances.Room
	// term is the terminal gateway.
	term *termgw.Gateway
	// logs is the workload logs gateway.
	logs *logsgw.Gateway
	// allocs is the allocations room.
	allocs *allocations.Room
	// sliceRoom runs the slice allocations' workflows (wireSlices).
	sliceRoom *sliceflow.Room
	// tasks is the task queue (and its event bus, subscribed in
	// subscribeTaskEvents).
	tasks *tasks.Room
	// ops is the operator tokens room.
	ops *operators.Room
	// pre is the preflight runs and evidence bundles room.
	pre *preflight.Room
	// secrets is the workload secrets room (operator routes, node fetch).
	secrets *secrets.Room
	// health schedules diag.health_probe and records finished probes on
	// their hosts.
	health *healthsched.Scheduler
	// dash is the server-rendered dashboard; it calls apiMux in-process.
	dash *dashboard.UI
	// taskPolls and instancePolls cap each node's concurrent long-polls of
	// the claim and desired-set routes.
	taskPolls, instancePolls *httpapi.LongPolls
	reg                      *prometheus.Registry

	nodeTLS *tls.Config
	// handshakes counts the node listener's TLS handshakes by result.
	handshakes *prometheus.CounterVec
	ready      chan struct{}
}

// New prepares a replica: it loads (or, on first start, creates) the CA and
// the task-signing keys from the store. It starts nothing.
func New(ctx context.Context, cfg Config, st store.Store) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, store: st, log: cfg.Logger, ready: make(chan struct{}),
		audit: audit.New(st, cfg.Now, cfg.Logger)}
	kr, err := keys.Open(ctx, st, keys.Config{KEK: cfg.KEK, InsecurePlaintextKeys: cfg.InsecurePlaintextKeys,
		Now: cfg.Now, Log: s.log})
	if err != nil {
		return nil, err
	}
	s.keys, s.ca = kr, kr.CA()
	if cfg.KEK != nil { // workload secrets sealed with a previous KEK of the ring
		if _, err := keys.SealWorkloadSecrets(ctx, st, cfg.KEK, s.log); err != nil {
			// Those rows stay as they are: fetching them fails
			// (secrets_injection_failed on the node) until set again.
			s.log.Warn("workload secrets that do not open with the key-encryption key", "err", err)
		}
		// Dashboard sessions' operator tokens, likewise: after a rotation
		// the retired KEK must open none of them.
		if _, err := dashboard.ResealSessions(ctx, st, cfg.KEK, s.log); err != nil {
			s.log.Warn("dashboard sessions not sealed again with the key-encryption key", "err", err)
		}
	}
	if cfg.NodeURL == "" {
		_, port, err := net.SplitHostPort(cfg.NodeAddr)
		if err != nil {
			return nil, fmt.Errorf("node listen address %q: %w", cfg.NodeAddr, err)
		}
		s.cfg.NodeURL = "https://127.0.0.1:" + port
	}
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	limitRefusals := httpapi.NewLimitRefusals(s.reg)
	s.inst = instances.New(instances.Config{VCPUAllocationRatio: s.cfg.VCPUAllocationRatio, Log: s.log, Now: cfg.Now},
		st, s.audit)
	s.hosts = hosts.New(hosts.Config{NodeURL: s.cfg.NodeURL, AllowUnknownHostRegistration: cfg.AllowUnknownHostRegistration,
		CertTTL: cfg.CertTTL, ReenrolGrace: cfg.CertReenrolGrace, HeartbeatInterval: cfg.HeartbeatInterval,
		BootstrapTokenTTL: cfg.BootstrapTokenTTL, RegisterRate: cfg.RegisterRate, RegisterBurst: cfg.RegisterBurst,
		AuthFailRate: cfg.AuthFailRate, AuthFailBurst: cfg.AuthFailBurst, Log: s.log, Now: cfg.Now},
		st, s.ca, s.keys, s.inst, s.audit, hosts.NewMetrics(s.reg))
	s.tasks = tasks.New(tasks.Config{Registry: s.cfg.Registry, MaxWait: s.cfg.MaxWait,
		FallbackPoll: s.cfg.LongPollFallback, Log: s.log, Now: cfg.Now},
		st, s.hosts, s.inst, s.keys, s.audit, tasks.NewMetrics(s.reg))
	s.term = termgw.New(s.cfg.Terminal, st, s.hosts, s.tasks, s.audit, termgw.NewMetrics(s.reg, limitRefusals),
		s.log, cfg.Now)
	s.logs = logsgw.New(s.cfg.Logs, st, s.hosts, s.tasks, s.audit, s.log, cfg.Now)
	s.allocs = allocations.New(st, s.inst, s.tasks, s.term, s.audit, s.cfg.Registry, s.log, cfg.Now)
	s.ops = operators.New(st, s.audit, cfg.Now)
	s.pre = preflight.New(preflight.Config{CollectWait: cfg.EvidenceCollectWait, Log: s.log, Now: cfg.Now}, st, s.hosts, s.tasks, s.keys, s.audit)
	s.secrets = secrets.New(st, s.keys, s.audit, s.log, cfg.Now)
	s.health = healthsched.New(healthsched.Config{Interval: cfg.HealthProbeInterval,
		HeartbeatInterval: s.cfg.HeartbeatInterval, Log: s.log, Now: cfg.Now}, st, s.tasks, s.hosts)
	s.subscribeTaskEvents()
	s.dash = s.newDashboard()
	s.taskPolls = httpapi.NewLongPolls("tasks", s.cfg.NodeLongPollLimit, s.reg, limitRefusals)
	s.instancePolls = httpapi.NewLongPolls("instances", s.cfg.NodeLongPollLimit, s.reg, limitRefusals)
	s.term.RegisterLiveSessions(s.reg)
	registerStoreMetrics(s.reg, st)
	s.handshakes = newHandshakeCounter(s.reg)
	if cfg.Terminal.RecordingDir == "" {
		s.log.Warn("terminal sessions are not recorded: no recording directory configured")
	}
	if s.nodeTLS, err = s.keys.NodeTLSConfig(s.cfg.NodeAddr, s.cfg.TLSHosts); err != nil {
		return nil, err
	}
	return s, nil
}

// publicOrigin checks a public URL (scheme http or https, a host, no path
// beyond "/", no query) and returns its origin, scheme://host[:port].
func publicOrigin(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") ||
		u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("public URL %q: must be http(s)://host[:port], the address browsers use for the operator listener", raw)
	}
	return u.Scheme + "://" + u.Host, nil
}

// CAHash is the pin agents use on first contact ("sha256:<hex>").
func (s *Server) CAHash() string { return s.ca.Hash() }

// CAPEM is the CA certificate agents trust.
func (s *Server) CAPEM() []byte { return s.ca.CertPEM() }

// NodeURL is the URL agents use for the node-facing API.
func (s *Server) NodeURL() string { return s.cfg.NodeURL }

// Ready is closed once both listeners accept connections.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Run serves both listeners and runs the background loops until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	opLn, nodeLn, err := Listen(&s.cfg)
	if err != nil {
		return err
	}
	return s.Serve(ctx, opLn, nodeLn)
}

// Listen opens cfg's two listeners (its defaults for unset addresses) and
// writes the ports they bound back into cfg. Called before New, it makes a
// port 0 usable: the node URL New derives and the addresses a caller
// reports name the real ports, and no other process can take them between
// a probe and the bind.
func Listen(cfg *Config) (op, node net.Listener, err error) {
	cfg.defaultAddrs()
	if op, err = net.Listen("tcp", cfg.OperatorAddr); err != nil {
		return nil, nil, fmt.Errorf("operator listener %s: %w", cfg.OperatorAddr, err)
	}
	if node, err = net.Listen("tcp", cfg.NodeAddr); err != nil {
		op.Close()
		return nil, nil, fmt.Errorf("node listener %s: %w", cfg.NodeAddr, err)
	}
	cfg.OperatorAddr, cfg.NodeAddr = boundAddr(cfg.OperatorAddr, op), boundAddr(cfg.NodeAddr, node)
	return op, node, nil
}

// boundAddr is addr with the port ln bound; the host stays as configured
// (":8443" stays ":8443", not "[::]:8443").
func boundAddr(addr string, ln net.Listener) string {
	host, _, err := net.SplitHostPort(addr)
	tcp, ok := ln.Addr().(*net.TCPAddr)
	if err != nil || !ok {
		return ln.Addr().String()
	}
	return net.JoinHostPort(host, strconv.Itoa(tcp.Port))
}

func (c *Config) defaultAddrs() {
	if c.OperatorAddr == "" {
		c.OperatorAddr = "127.0.0.1:8080"
	}
	if c.NodeAddr == "" {
		c.NodeAddr = ":8443"
	}
}

// Serve is Run on listeners the caller opened (tests use port 0).
func (s *Server) Serve(ctx context.Context, opLn, nodeLn net.Listener) error {
	events, err := s.store.Subscribe(ctx)
	if err != nil {
		opLn.Close()
		nodeLn.Close()
		return fmt.Errorf("subscribe to store events: %w", err)
	}
	opSrv := s.httpServer(s.OperatorHandler())
	nodeSrv := s.httpServer(s.NodeHandler())
	// The node listener does the TLS handshakes itself (handshakeListener);
	// the server's copy of the config tells it to speak HTTP/2 on them.
	nodeSrv.TLSConfig = nodeListenerTLS(s.nodeTLS)
	nodeTLSLn := newHandshakeListener(nodeLn, nodeListenerTLS(s.nodeTLS), s.cfg.ReadHeaderTimeout, s.log,
		s.handshakes)
	mux := newMuxServer(nodeSrv.Handler, s.cfg, s.log, true)
	nodeTLSLn.mux = mux.serve

	g, gctx := errgroup.WithContext(ctx)
	s.term.Start(gctx)
	g.Go(func() error { s.dispatchEvents(gctx, events); return nil })
	g.Go(func() error { s.hosts.Run(gctx); return nil })
	g.Go(func() error { s.tasks.Reap(gctx); return nil })
	g.Go(func() error { s.tasks.RunFallback(gctx); return nil })
	g.Go(func() error { s.sliceRoom.RunSweeper(gctx, sliceflow.SweepInterval); return nil })
	g.Go(func() error { s.allocs.RunSweeper(gctx, allocations.SweepInterval); return nil })
	g.Go(func() error { s.health.Run(gctx); return nil })
	g.Go(func() error { s.term.Run(gctx); return nil })
	g.Go(func() error { s.keys.Run(gctx); return nil })
	g.Go(func() error { return serveUntil(gctx, opSrv, func() error { return opSrv.Serve(opLn) }) })
	g.Go(func() error {
		return serveUntil(gctx, nodeSrv, func() error { return nodeSrv.Serve(nodeTLSLn) })
	})
	g.Go(func() error { <-gctx.Done(); mux.Close(); return nil })
	close(s.ready)
	s.log.Info("control plane listening", "operator", opLn.Addr().String(), "node", nodeLn.Addr().String(),
		"node_url", s.cfg.NodeURL)
	err = g.Wait()
	// Flush coalesced heartbeats so a clean stop loses nothing.
	flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.hosts.Flush(flushCtx)
	return err
}

func serveUntil(ctx context.Context, srv *http.Server, serve func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	case <-ctx.Done():
		shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutCtx); err != nil {
			srv.Close()
		}
		return nil
	}
}

// dispatchEvents fans store change events out to waiters and caches.
func (s *Server) dispatchEvents(ctx context.Context, events <-chan store.Event) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			switch ev.Kind {
			case store.EventTask:
				s.tasks.Wake(ev.ID)
			case store.EventHost:
				s.hosts.Invalidate(ev.ID)
				s.tasks.Wake(ev.ID) // a waiting revoked node re-checks and is refused
				s.inst.Wake(ev.ID)  // draining is part of the node's instance set
			case store.EventInstance:
				s.inst.Wake(ev.ID)
			case store.EventResync: // events were lost: every waiter re-reads
				s.log.Info("store events resynchronised: waking every long-poll")
				s.hosts.InvalidateAll()
				s.tasks.WakeAll()
				s.inst.WakeAll()
			}
			s.term.Event(ctx, ev) // host, allocation and token changes end terminals
		}
	}
}

// OperatorTokenSpec is an operator token to mint (see operators.TokenSpec).
type OperatorTokenSpec = operators.TokenSpec

// CreateOperatorToken mints an operator token, returned once (see
// operators.Room.CreateToken for the minting rule and errors). `drover dev`
// and `drover token create --store` use it.
func (s *Server) CreateOperatorToken(ctx context.Context, spec OperatorTokenSpec) (api.OperatorToken, error) {
	return s.ops.CreateToken(ctx, spec)
}

// EnsureHost creates the host record if it is missing and, unless the host
// holds a certificate that is still valid, issues a fresh bootstrap token
// (returned; "" when none is needed). `drover dev` uses it for its local
// agent.
func (s *Server) EnsureHost(ctx context.Context, id, osFamily string) (string, error) {
	return s.hosts.EnsureHost(ctx, id, osFamily)
}
