package cli

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/postgres"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
)

// ServerFlags configure a control plane replica.
type ServerFlags struct {
	Config ConfigFile `name:"config" env:"DROVER_CONFIG" placeholder:"FILE" help:"TOML, YAML or JSON file of these flags' values (keys: the long flag names in snake_case, e.g. node_listen); flags and DROVER_* variables override it (docs/configuration.md)."`

	Listen              string        `name:"listen" env:"DROVER_LISTEN" default:"127.0.0.1:8080" help:"Operator API and UI address."`
	NodeListen          string        `name:"node-listen" env:"DROVER_NODE_LISTEN" help:"Node-facing mTLS address (default :8443 for server, 127.0.0.1:8443 for dev)."`
	NodeURL             string        `name:"node-url" env:"DROVER_NODE_URL" help:"URL agents use to reach --node-listen (default https://127.0.0.1:<port>)."`
	AdvertiseNodeURL    string        `name:"advertise-node-url" env:"DROVER_ADVERTISE_NODE_URL" help:"This replica's own node-facing URL, reachable by agents directly (not through a load balancer): terminal and logs streams are dialed there. Needed with several replicas; its host is added to the node certificate (docs/runbooks/replicas.md)."`
	TLSSAN              []string      `name:"tls-san" env:"DROVER_TLS_SAN" help:"Extra DNS names or IPs for the node listener certificate."`
	PublicURL           string        `name:"public-url" env:"DROVER_PUBLIC_URL" help:"URL browsers use for --listen when a proxy in front terminates TLS (https://... makes the dashboard's cookies Secure; its origin may open terminals)."`
	CertTTL             time.Duration `name:"cert-ttl" default:"24h" help:"Node certificate lifetime."`
	CertReenrolGrace    time.Duration `name:"node-cert-reenrol-grace" env:"DROVER_NODE_CERT_REENROL_GRACE" default:"168h" help:"How long after its expiry an agent's last certificate still enrols it again without a bootstrap token (the agent proves it holds its key); 0 turns this off (docs/adr/0021-reenrol-with-an-expired-certificate.md)."`
	HeartbeatInterval   time.Duration `name:"heartbeat-interval" default:"5s" help:"Heartbeat interval agents are told to use; stale after 3 missed."`
	RegisterRate        float64       `name:"register-rate" env:"DROVER_REGISTER_RATE" default:"5" help:"Enrolments (POST /internal/v1/register) per second one client IP address may make once its --register-burst is spent (429 rate_limited beyond). Raise it when many hosts enrol or re-enrol together behind one NAT address."`
	RegisterBurst       int           `name:"register-burst" env:"DROVER_REGISTER_BURST" default:"10" help:"Enrolments one client IP address may make at once before --register-rate applies."`
	HealthProbeInterval time.Duration `name:"health-probe-interval" env:"DROVER_HEALTH_PROBE_INTERVAL" default:"10m" help:"How often each enabled, heartbeating host runs diag.health_probe (spread over the interval; its result is the host's health); 0 disables."`
	VCPURatio           float64       `name:"vcpu-allocation-ratio" env:"DROVER_VCPU_ALLOCATION_RATIO" default:"4" help:"Instance vCPUs placed per host CPU (memory, disk and GPUs are never overcommitted)."`
	LogLevel            slog.Level    `name:"log-level" default:"info" help:"debug, info, warn or error."`

	TerminalOrigins     []string      `name:"terminal-allowed-origin" env:"DROVER_TERMINAL_ALLOWED_ORIGINS" help:"Browser origins besides the control plane's own that may open terminals (scheme://host[:port], repeatable)."`
	TerminalIdle        time.Duration `name:"terminal-idle-timeout" default:"30m" help:"End a terminal session after this long without input."`
	TerminalMaxLifetime time.Duration `name:"terminal-max-lifetime" default:"12h" help:"End any terminal session after this long."`
	RecordingDir        string        `name:"recording-dir" env:"DROVER_RECORDING_DIR" help:"Directory for asciicast v2 terminal recordings (default: recordings/ beside a SQLite database, /var/lib/drover/recordings otherwise)."`
	RecordInput         bool          `name:"record-input" help:"Also record terminal keystrokes (they include passwords typed at prompts that do not echo)."`

	HTTPReadHeaderTimeout time.Duration `name:"http-read-header-timeout" default:"10s" help:"Both listeners: time to read a request's headers (and the TLS handshake)."`
	HTTPBodyTimeout       time.Duration `name:"http-body-timeout" default:"30s" help:"Both listeners: added to --http-read-header-timeout, the time to read a whole request (long-polls and WebSockets have no body and are not limited)."`
	HTTPIdleTimeout       time.Duration `name:"http-idle-timeout" default:"2m" help:"Both listeners: close keep-alive connections idle this long."`
	HTTPMaxHeaderBytes    int           `name:"http-max-header-bytes" default:"65536" help:"Both listeners: largest request header block (431 beyond)."`
	NodeLongPollLimit     int           `name:"node-long-poll-limit" default:"4" help:"Long-polls of one route (tasks, instances) a node may hold open on this replica (429 node_long_poll_limit beyond)."`
	LongPollFallback      time.Duration `name:"long-poll-fallback-interval" default:"10s" help:"How often a replica re-checks the task queue for the agents' parked long-polls in case a change event was lost (a PostgreSQL restart); negative disables."`
	TerminalPerNode       int           `name:"terminal-sessions-per-node" default:"16" help:"Terminal sessions one node may have on this replica (terminal_session_limit beyond)."`
	TerminalRecheck       time.Duration `name:"terminal-recheck-interval" default:"30s" help:"How often live terminals re-check their node, allocation and token in case a change event was lost."`
	TerminalDispatch      time.Duration `name:"terminal-dispatch-timeout" default:"10s" help:"How long the gateway waits for the node to pick up terminal.open (node_offline or dispatch_timeout beyond)."`
	TerminalNodeStream    time.Duration `name:"terminal-node-stream-timeout" default:"15s" help:"How long the gateway waits for the node's stream once it picked up terminal.open (node_stream_timeout beyond)."`
	TerminalPTY           time.Duration `name:"terminal-pty-timeout" default:"15s" help:"How long the gateway waits for the node's ready frame once its stream connected (terminal_pty_failed beyond)."`
}

func (f ServerFlags) config(allowUnknown bool, log *slog.Logger) server.Config {
	return server.Config{OperatorAddr: f.Listen, NodeAddr: f.NodeListen, NodeURL: f.NodeURL, AdvertiseNodeURL: f.AdvertiseNodeURL, TLSHosts: f.TLSSAN, PublicURL: f.PublicURL,
		CertTTL: f.CertTTL, CertReenrolGrace: reenrolGrace(f.CertReenrolGrace), HeartbeatInterval: f.HeartbeatInterval, VCPUAllocationRatio: f.VCPURatio, AllowUnknownHostRegistration: allowUnknown,
		Logger: log, Terminal: server.TerminalConfig{AllowedOrigins: f.TerminalOrigins, IdleTimeout: f.TerminalIdle,
			MaxLifetime: f.TerminalMaxLifetime, RecordingDir: f.RecordingDir, RecordInput: f.RecordInput,
			MaxSessionsPerNode: f.TerminalPerNode, RecheckInterval: f.TerminalRecheck, DispatchTimeout: f.TerminalDispatch,
			NodeStreamTimeout: f.TerminalNodeStream, PTYTimeout: f.TerminalPTY},
		ReadHeaderTimeout: f.HTTPReadHeaderTimeout, BodyReadTimeout: f.HTTPBodyTimeout, IdleTimeout: f.HTTPIdleTimeout,
		MaxHeaderBytes: f.HTTPMaxHeaderBytes, NodeLongPollLimit: f.NodeLongPollLimit, HealthProbeInterval: f.HealthProbeInterval,
		LongPollFallback: f.LongPollFallback, RegisterRate: rate.Limit(f.RegisterRate), RegisterBurst: f.RegisterBurst}
}

// Validate refuses values the replica cannot run with, naming the flag
// (kong calls it after parsing, for server and dev alike).
func (f ServerFlags) Validate() error {
	if !(f.RegisterRate > 0) || math.IsInf(f.RegisterRate, 0) {
		return fmt.Errorf("--register-rate %v: must be a positive number of enrolments per second", f.RegisterRate)
	}
	if f.RegisterBurst < 1 {
		return fmt.Errorf("--register-burst %d: must be at least 1", f.RegisterBurst)
	}
	return nil
}

func newLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// ServerCmd runs one replica.
type ServerCmd struct {
	ServerFlags
	KEKFlags
	Store                        string `name:"store" env:"DROVER_STORE" required:"" help:"sqlite:PATH or postgres://..."`
	AllowUnknownHostRegistration bool   `name:"allow-unknown-host-registration" env:"ALLOW_UNKNOWN_HOST_REGISTRATION" help:"Let unknown hosts enrol without a host record (dev only)."`
	LogFormat                    string `name:"log-format" env:"DROVER_LOG_FORMAT" enum:"text,json" default:"text" help:"Log format on stderr: text or json (one object a line, for journald)."`
}

// Run implements the command.
func (c *ServerCmd) Run(ctx context.Context) error {
	log := newFormatLogger(os.Stderr, c.LogLevel, c.LogFormat)
	st, err := openStore(ctx, c.Store, log)
	if err != nil {
		return err
	}
	defer st.Close()
	ring, err := c.ring(log)
	if err != nil {
		return err
	}
	if c.AllowUnknownHostRegistration {
		log.Warn("unknown host registration is enabled: any agent that reaches the node listener can enrol")
	}
	if c.RecordingDir == "" {
		c.RecordingDir = "/var/lib/drover/recordings"
		if path, ok := strings.CutPrefix(c.Store, "sqlite:"); ok {
			c.RecordingDir = filepath.Join(filepath.Dir(path), "recordings")
		}
	}
	cfg := c.config(c.AllowUnknownHostRegistration, log)
	cfg.KEK, cfg.InsecurePlaintextKeys = ring, c.InsecurePlaintextKeys
	// Bound first, so a port 0 is known to New (the node URL) and to the
	// status systemd shows.
	opLn, nodeLn, err := server.Listen(&cfg)
	if err != nil {
		return err
	}
	srv, err := server.New(ctx, cfg, st)
	if err != nil {
		opLn.Close()
		nodeLn.Close()
		return err
	}
	return runNotified(ctx, srv, cfg, log, opLn, nodeLn) // srv.Serve with sd_notify under systemd
}

// openStore opens the store named by spec: sqlite:PATH or postgres://...;
// log receives what the store does on its own (nil: nothing).
func openStore(ctx context.Context, spec string, log *slog.Logger) (store.Store, error) {
	switch {
	case strings.HasPrefix(spec, "sqlite:"):
		var opts []sqlite.Option
		if log != nil {
			opts = append(opts, sqlite.WithLogger(log))
		}
		return sqlite.Open(ctx, strings.TrimPrefix(spec, "sqlite:"), opts...)
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return postgres.Open(ctx, spec)
	}
	return nil, fmt.Errorf("--store %q: want sqlite:PATH or a postgres:// URL", spec)
}

// reenrolGrace is --node-cert-reenrol-grace as server.Config takes it: 0
// (off) is negative there, where 0 is the default.
func reenrolGrace(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
