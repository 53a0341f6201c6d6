// Package bench is the fleet load harness (`drover bench fleet`): it runs
// many simulated node agents against a control plane — one it starts on
// loopback, in this process or as a `drover server` child process, or an
// external one on loopback — and reports heartbeat throughput and latency,
// task dispatch latency with many idle long-polls, task claim+result
// throughput and control-plane memory per idle long-poll.
//
// Simulated agents are real clients of the node API: each enrols through
// POST /internal/v1/register with its own key and CSR and then talks mTLS
// over its own HTTP/2 connection, like internal/node/agent. The harness connects
// to loopback addresses only.
package bench

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Throughput-phase enqueue modes (Config.Enqueue).
const (
	EnqueueSingle = "single"
	EnqueueBatch  = "batch"
)

// MaxAgents bounds --agents (one loopback source address per agent).
const MaxAgents = 250 * 256

// Config configures a fleet run. Zero values take the defaults noted.
type Config struct {
	Agents          int           // simulated agents (default 1000)
	LongPolls       int           // agents holding idle long-polls (default Agents)
	HeartbeatAgents int           // agents heartbeating in the heartbeat phase (default Agents)
	HeartbeatRate   float64       // offered heartbeats/s in total; 0 = closed loop, as fast as answered
	Duration        time.Duration // heartbeat phase (default 10s)
	Tasks           int           // tasks in the throughput phase (default 2000)
	DispatchSamples int           // enqueue→receive samples (default 1000)
	// HeartbeatWarmup is how long the agents heartbeat before the phase's
	// figures begin (default 2s; negative: none).
	HeartbeatWarmup time.Duration
	// Enqueue is how the throughput phase queues its tasks: "single" (one
	// POST /api/v1/tasks each, the default) or "batch" (POST
	// /api/v1/tasks:batch with BatchSize tasks each).
	Enqueue   string
	BatchSize int // tasks per batch call (default 100, at most api.MaxTaskBatch)
	// TaskType is the type of the dispatch and throughput tasks:
	// diag.health_probe (the default; every result also updates its host's
	// health) or diag.echo (the task queue alone).
	TaskType string
	// ClaimMax is how many tasks an agent's long-poll claims at most
	// (GET .../tasks/wait?max=N); the results of one wait go in one POST
	// .../tasks/results. Default 1.
	ClaimMax int

	Store            string // sqlite:[PATH] (default: temp file) or postgres://...
	ServerProcess    bool   // run `drover server` as a child process
	ServerBin        string // the drover executable for ServerProcess (default: this one)
	ServerGOMAXPROCS int    // GOMAXPROCS of the child (default: inherited)
	ServerGOGC       string // GOGC of the child (default: inherited); a low value keeps its heap near live data
	KEKFile          string // key-encryption key of Store's private keys (default: a new one beside the temporary store)

	// External control plane (all on loopback).
	NodeURL, API, Token, CAHash string

	CPUProfile string // CPU profile of this process over the load phases
	MemProfile string // heap profile of this process with the long-polls open

	// Settle is the pause before each memory sample (default 2s + 1s per 5000 agents).
	Settle time.Duration
	// Log receives progress lines and the in-process server's warnings.
	Log io.Writer
	// Seed makes the choice of dispatch targets repeatable (0: random).
	Seed uint64
	// ReconnectStorm adds the reconnect-storm phase after the heartbeats
	// (ServerProcess only): the server is SIGKILLed and restarted and every
	// agent reconnects.
	ReconnectStorm bool
	// NoTLSResumption makes the agents keep no TLS session tickets, so
	// every reconnect is a full handshake (the baseline of the storm).
	NoTLSResumption bool
	// ClientHandshakes bounds how many client-side TLS handshakes the
	// harness runs at once (0: default 64; negative: no bound).
	ClientHandshakes int
	// HTTP2 keeps the agents on HTTP/2 instead of the framed connection
	// (nodemux) the real agent uses (the baseline of the framing).
	HTTP2 bool
}

func (c *Config) defaults() error {
	if c.Agents == 0 {
		c.Agents = 1000
	}
	if c.ClientHandshakes == 0 {
		c.ClientHandshakes = 64
	}
	if c.Agents < 1 || c.Agents > MaxAgents {
		return fmt.Errorf("agents must be between 1 and %d", MaxAgents)
	}
	if c.LongPolls == 0 || c.LongPolls > c.Agents {
		c.LongPolls = c.Agents
	}
	if c.HeartbeatAgents == 0 || c.HeartbeatAgents > c.Agents {
		c.HeartbeatAgents = c.Agents
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	switch {
	case c.HeartbeatWarmup == 0:
		c.HeartbeatWarmup = 2 * time.Second
	case c.HeartbeatWarmup < 0:
		c.HeartbeatWarmup = 0
	}
	if c.Tasks == 0 {
		c.Tasks = 2000
	}
	if c.DispatchSamples == 0 {
		c.DispatchSamples = 1000
	}
	switch c.Enqueue {
	case "":
		c.Enqueue = EnqueueSingle
	case EnqueueSingle, EnqueueBatch:
	default:
		return fmt.Errorf("enqueue must be %q or %q", EnqueueSingle, EnqueueBatch)
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	switch c.TaskType {
	case "":
		c.TaskType = task.TypeHealthProbe
	case task.TypeHealthProbe, task.TypeEcho:
	default:
		return fmt.Errorf("task type must be %q or %q", task.TypeHealthProbe, task.TypeEcho)
	}
	if c.ClaimMax == 0 {
		c.ClaimMax = 1
	}
	if c.ClaimMax < 1 || c.ClaimMax > api.MaxClaim {
		return fmt.Errorf("claim max must be between 1 and %d", api.MaxClaim)
	}
	if c.BatchSize < 1 || c.BatchSize > api.MaxTaskBatch {
		return fmt.Errorf("batch size must be between 1 and %d", api.MaxTaskBatch)
	}
	if c.Settle == 0 {
		c.Settle = 2*time.Second + time.Duration(c.Agents/5000)*time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Seed == 0 {
		c.Seed = mrand.Uint64()
	}
	if c.external() {
		if c.NodeURL == "" || c.API == "" || c.Token == "" {
			return errors.New("an external control plane needs --node-url, --api and --token")
		}
		if !isLoopbackURL(c.NodeURL) || !isLoopbackURL(c.API) {
			return errors.New("the harness only targets loopback addresses (--node-url and --api)")
		}
		if c.ServerProcess {
			return errors.New("--server-process and an external control plane exclude each other")
		}
	}
	if c.ReconnectStorm && !c.ServerProcess {
		return errors.New("--reconnect-storm needs --server-process")
	}
	return nil
}

func (c *Config) external() bool { return c.NodeURL != "" || c.API != "" }

// fleet is one run in progress.
type fleet struct {
	cfg    Config
	t      *target
	op     *opClient
	agents []*simAgent
	track  *tracker
	runID  string
	rep    *Report
	// handshakes is the harness's client-handshake gate (nil: unbounded).
	handshakes chan struct{}
}

func (f *fleet) logf(format string, args ...any) {
	fmt.Fprintf(f.cfg.Log, "bench: "+format+"\n", args...)
}

// Run executes a fleet run and returns its report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	f := &fleet{cfg: cfg, track: newTracker(), rep: &Report{Machine: machine()}}
	if cfg.ClientHandshakes > 0 {
		f.handshakes = make(chan struct{}, cfg.ClientHandshakes)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	f.runID = hex.EncodeToString(b[:])
	nofile := raiseNoFile(uint64(2*cfg.Agents + 4096))
	f.rep.Config = ReportConfig{Agents: cfg.Agents, LongPolls: cfg.LongPolls, HeartbeatAgents: cfg.HeartbeatAgents,
		HeartbeatRate: cfg.HeartbeatRate, DurationS: cfg.Duration.Seconds(), Tasks: cfg.Tasks,
		DispatchSamples: cfg.DispatchSamples, Enqueue: cfg.Enqueue, NoFileLimit: nofile, Store: cfg.Store,
		ServerGOMAXPROCS: cfg.ServerGOMAXPROCS, ServerGOGC: cfg.ServerGOGC, ClientHandshakes: cfg.ClientHandshakes}
	if need := uint64(cfg.Agents + 256); nofile != 0 && nofile < need {
		return nil, fmt.Errorf("RLIMIT_NOFILE is %d; %d agents need at least %d", nofile, cfg.Agents, need)
	}

	dir, err := os.MkdirTemp("", "drover-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	switch {
	case cfg.external():
		f.t = &target{mode: ModeExternal, opURL: cfg.API, nodeURL: cfg.NodeURL, token: cfg.Token, caHash: cfg.CAHash,
			stop: func() error { return nil }}
		f.rep.Config.Store = ""
	case cfg.ServerProcess:
		f.t, err = startProcess(ctx, &f.cfg, dir)
	default:
		f.t, err = startInProcess(ctx, &f.cfg, dir)
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := f.t.stop(); err != nil {
			f.logf("stop control plane: %v", err)
		}
	}()
	if f.rep.Config.Store == "" && !cfg.external() {
		f.rep.Config.Store = "sqlite: (temporary file)"
	}
	f.rep.Config.Mode = f.t.mode
	f.op = newOpClient(f.t.opURL, f.t.token)
	defer f.op.hc.CloseIdleConnections()
	if err := f.checkCA(ctx); err != nil {
		return nil, err
	}
	f.logf("%s control plane: operator %s, node %s", f.t.mode, f.t.opURL, f.t.nodeURL)

	if err := f.setup(ctx); err != nil {
		return nil, err
	}
	defer func() {
		for _, a := range f.agents {
			if a.tr != nil {
				a.tr.CloseIdleConnections()
			}
		}
	}()

	memOn := f.t.mode != ModeExternal
	if memOn {
		f.rep.Memory = &MemoryReport{Source: f.t.mode, IncludesClients: f.t.mode == ModeInProcess, LongPolls: cfg.LongPolls}
		if f.rep.Memory.NoConnections, err = f.memSample(ctx); err != nil {
			return nil, err
		}
	}
	if err := f.connect(ctx); err != nil {
		return nil, err
	}
	if memOn {
		if f.rep.Memory.IdleConnections, err = f.memSample(ctx); err != nil {
			return nil, err
		}
	}

	// Open the long-polls; they stay open through every later phase.
	pollCtx, stopPolls := context.WithCancel(ctx)
	var pollWG sync.WaitGroup
	var pollErrs atomic.Int64
	var written atomic.Int64
	allWritten := make(chan struct{})
	pollers := f.agents[:cfg.LongPolls]
	for _, a := range pollers {
		pollWG.Add(1)
		go func() {
			defer pollWG.Done()
			a.pollLoop(pollCtx, f.cfg.ClaimMax, f.track, &pollErrs, func() {
				if written.Add(1) == int64(len(pollers)) {
					close(allWritten)
				}
			})
		}()
	}
	defer func() { stopPolls(); pollWG.Wait() }()
	select {
	case <-allWritten:
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("only %d of %d long-polls opened in 2m", written.Load(), len(pollers))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.logf("%d long-polls open", len(pollers))
	if memOn {
		if f.rep.Memory.LongPollsOpen, err = f.memSample(ctx); err != nil {
			return nil, err
		}
		f.rep.Memory.compute()
		f.logf("memory: %+v", *f.rep.Memory)
	}
	if cfg.MemProfile != "" {
		if err := writeHeapProfile(cfg.MemProfile); err != nil {
			return nil, err
		}
	}
	if cfg.CPUProfile != "" {
		pf, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			pf.Close()
			return nil, err
		}
		defer func() { pprof.StopCPUProfile(); pf.Close() }()
	}

	if err := f.dispatch(ctx, pollers); err != nil {
		return nil, err
	}
	if err := f.throughput(ctx, pollers); err != nil {
		return nil, err
	}
	f.heartbeats(ctx)
	f.rep.Heartbeats.LongPollsOpen = len(pollers)
	if cfg.ReconnectStorm {
		if err := f.storm(ctx); err != nil {
			return nil, err
		}
	}
	f.rep.Machine.LoadAvgEnd = loadAvg()
	f.rep.evaluate()
	return f.rep, nil
}

func writeHeapProfile(path string) error {
	runtime.GC()
	pf, err := os.Create(path)
	if err != nil {
		return err
	}
	defer pf.Close()
	return pprof.WriteHeapProfile(pf)
}

// checkCA reads the CA pin from the operator API and checks --ca-hash.
func (f *fleet) checkCA(ctx context.Context) error {
	var ca struct {
		Hash string `json:"ca_hash"`
	}
	if err := f.op.call(ctx, http.MethodGet, "/api/v1/ca", nil, &ca); err != nil {
		return fmt.Errorf("read CA from the operator API: %w", err)
	}
	if f.t.caHash == "" {
		f.t.caHash = ca.Hash
	} else if f.t.caHash != ca.Hash {
		return fmt.Errorf("--ca-hash %s does not match the control plane's CA %s", f.t.caHash, ca.Hash)
	}
	return nil
}

// parallel runs fn(i) for i in [0,n) on workers goroutines and returns the
// first error (the remaining items are skipped after one).
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
		failed  atomic.Bool
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() && ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					errOnce.Do(func() { first = err })
					failed.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// setup creates the host records and enrols every agent.
func (f *fleet) setup(ctx context.Context) error {
	n := f.cfg.Agents
	f.agents = make([]*simAgent, n)
	tokens := make([]string, n)
	start := time.Now()
	err := parallel(ctx, n, 16, func(i int) error {
		id := fmt.Sprintf("bench-%s-%05d", f.runID, i)
		var bt api.BootstrapToken
		if err := f.op.call(ctx, http.MethodPost, "/api/v1/hosts", api.CreateHostRequest{HostID: id, OSFamily: api.OSLinux,
			Labels: map[string]string{"bench": f.runID}}, &bt); err != nil {
			return fmt.Errorf("create host %s: %w", id, err)
		}
		tokens[i] = bt.Token
		f.agents[i] = &simAgent{idx: i, id: id, base: f.t.nodeURL, local: sourceAddr(f.t.nodeURL, i),
			resume: !f.cfg.NoTLSResumption, gate: f.handshakes, http2: f.cfg.HTTP2}
		return nil
	})
	if err != nil {
		return err
	}
	f.rep.Setup.HostsCreated = n
	f.rep.Setup.CreateHostsS = secs(time.Since(start))
	f.logf("created %d hosts in %.1fs", n, f.rep.Setup.CreateHostsS)

	start = time.Now()
	var roots atomic.Pointer[x509.CertPool]
	var retries atomic.Int64
	err = parallel(ctx, n, 8*runtime.GOMAXPROCS(0), func(i int) error {
		return f.agents[i].enrol(ctx, tokens[i], f.t.caHash, &roots, &retries)
	})
	if err != nil {
		return err
	}
	el := time.Since(start)
	f.rep.Setup.Enrolled = n
	f.rep.Setup.EnrolS = secs(el)
	f.rep.Setup.EnrolPerSec = perSec(n, el)
	f.rep.Setup.RegisterRetry = retries.Load()
	f.logf("enrolled %d agents in %.1fs (%d retries)", n, f.rep.Setup.EnrolS, retries.Load())
	return nil
}

// connect opens every agent's mTLS connection with one heartbeat (the
// first one moves the host to healthy and stores its capacity).
func (f *fleet) connect(ctx context.Context) error {
	start := time.Now()
	var errs atomic.Int64
	_ = parallel(ctx, len(f.agents), 128, func(i int) error {
		var err error
		for range 3 {
			if err = f.agents[i].heartbeat(ctx); err == nil {
				return nil
			}
		}
		errs.Add(1)
		f.logf("first heartbeat of %s: %v", f.agents[i].id, err)
		return nil
	})
	f.rep.Setup.ConnectS = secs(time.Since(start))
	f.rep.Setup.ConnectErrors = errs.Load()
	f.logf("connected %d agents in %.1fs (%d errors)", len(f.agents), f.rep.Setup.ConnectS, errs.Load())
	if e := errs.Load(); e > int64(len(f.agents)/100) {
		return fmt.Errorf("%d of %d agents could not connect", e, len(f.agents))
	}
	return ctx.Err()
}
