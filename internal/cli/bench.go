package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/drover-dev/drover/internal/bench"
)

// BenchCmd groups the load harnesses.
type BenchCmd struct {
	Fleet BenchFleetCmd `cmd:"" help:"Simulate a fleet of agents (real enrolment and mTLS) and report heartbeat, dispatch, throughput and memory figures as JSON."`
	Plot  BenchPlotCmd  `cmd:"" help:"Render SVG charts (heartbeats/s, dispatch latency CDF, reconnect storm) from a 'bench fleet' JSON report."`
	// StormProbe is run by 'bench fleet --reconnect-storm' as a process of
	// its own.
	StormProbe BenchStormProbeCmd `cmd:"" name:"storm-probe" hidden:"" help:"The reconnect storm's operator client (run by 'bench fleet --reconnect-storm'): call /readyz and read a host in a loop, one JSON line per call, until killed."`
}

// BenchStormProbeCmd is the reconnect storm's operator probe.
type BenchStormProbeCmd struct {
	API   string   `name:"api" required:"" help:"Operator API of the control plane under test (loopback only)."`
	Token string   `name:"token" env:"DROVER_TOKEN" required:"" help:"Operator token."`
	Hosts []string `name:"hosts" required:"" help:"Host ids to read, comma-separated."`
}

// Run implements the command.
func (c *BenchStormProbeCmd) Run(ctx context.Context, env *Env) error {
	return bench.Probe(ctx, c.API, c.Token, c.Hosts, env.Stdout)
}

// BenchPlotCmd renders a fleet report's charts.
type BenchPlotCmd struct {
	In     string `name:"in" type:"existingfile" required:"" help:"JSON report of 'drover bench fleet'."`
	Out    string `name:"out" type:"path" required:"" help:"Directory for the SVG files."`
	Prefix string `name:"prefix" help:"Prefix of each file name (e.g. 'run-a-')."`
}

// Run implements the command.
func (c *BenchPlotCmd) Run(_ context.Context, env *Env) error {
	raw, err := os.ReadFile(c.In)
	if err != nil {
		return err
	}
	var rep bench.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return fmt.Errorf("%s: %w", c.In, err)
	}
	paths, err := bench.WritePlots(&rep, c.Out, c.Prefix)
	for _, p := range paths {
		fmt.Fprintln(env.Stdout, p)
	}
	return err
}

// BenchFleetCmd runs the fleet load harness.
type BenchFleetCmd struct {
	Agents           int           `name:"agents" default:"1000" help:"Simulated agents, each with its own key, certificate and connection."`
	Duration         time.Duration `name:"duration" default:"10s" help:"Length of the heartbeat phase."`
	HeartbeatWarmup  time.Duration `name:"heartbeat-warmup" default:"2s" help:"How long the agents heartbeat before the heartbeat phase's figures begin (0: none)."`
	LongPolls        int           `name:"long-polls" help:"Agents holding idle long-polls (default: --agents)."`
	HeartbeatAgents  int           `name:"heartbeat-agents" help:"Agents heartbeating in the heartbeat phase (default: --agents)."`
	HeartbeatRate    float64       `name:"heartbeat-rate" help:"Offered heartbeats/s in total, paced per agent (open loop); 0: every agent as fast as answered (closed loop)."`
	Tasks            int           `name:"tasks" default:"2000" help:"Tasks in the claim+result throughput phase."`
	DispatchSamples  int           `name:"dispatch-samples" default:"1000" help:"Tasks enqueued one at a time to time enqueue → agent receives."`
	Enqueue          string        `name:"enqueue" default:"single" enum:"single,batch" help:"How the throughput phase queues its tasks: single (POST /api/v1/tasks each) or batch (POST /api/v1/tasks:batch)."`
	BatchSize        int           `name:"batch-size" default:"100" help:"Tasks per POST /api/v1/tasks:batch call with --enqueue batch."`
	TaskType         string        `name:"task-type" default:"diag.health_probe" enum:"diag.health_probe,diag.echo" help:"Type of the dispatch and throughput tasks: diag.health_probe (each result also updates the host's health) or diag.echo (the task queue alone)."`
	ClaimMax         int           `name:"claim-max" default:"1" help:"Tasks one agent long-poll claims at most (GET .../tasks/wait?max=N, at most 32); the results of one wait go in one POST .../tasks/results."`
	Store            string        `name:"store" default:"sqlite:" help:"Store of the control plane the harness starts: sqlite:[PATH] (default: a temporary file) or postgres://..."`
	ServerProcess    bool          `name:"server-process" help:"Run the control plane as a 'drover server' child process (server-only memory and CPU figures)."`
	ServerBin        string        `name:"server-bin" help:"drover executable for --server-process (default: this one)."`
	ServerProcs      int           `name:"server-gomaxprocs" help:"GOMAXPROCS of the --server-process child (default: inherited)."`
	ServerGOGC       string        `name:"server-gogc" help:"GOGC of the --server-process child (default: inherited); a low value keeps its heap near live data for the memory figure."`
	KEKFile          string        `name:"kek-file" env:"DROVER_KEK_FILE" help:"Key-encryption key of the private keys in --store (default: a new one in the run's temporary directory; give it to reuse a store)."`
	NodeURL          string        `name:"node-url" help:"Node API of an external control plane on loopback (with --api, --token)."`
	API              string        `name:"api" help:"Operator API of an external control plane on loopback."`
	Token            string        `name:"token" env:"DROVER_TOKEN" help:"Operator token of the external control plane."`
	CAHash           string        `name:"ca-hash" help:"Expected CA pin of the external control plane (default: read from the operator API)."`
	Out              string        `name:"out" type:"path" help:"Also write the JSON report to this file."`
	CPUProfile       string        `name:"cpuprofile" type:"path" help:"Write a CPU profile of this process over the load phases."`
	MemProfile       string        `name:"memprofile" type:"path" help:"Write a heap profile of this process with the long-polls open."`
	Settle           time.Duration `name:"settle" help:"Pause before each memory sample (default 2s + 1s per 5000 agents)."`
	Quiet            bool          `name:"quiet" short:"q" help:"No progress lines on stderr."`
	ReconnectStorm   bool          `name:"reconnect-storm" help:"After the heartbeat phase, SIGKILL the --server-process child, start it again on the same store and addresses, and time every agent's reconnection while an operator client keeps reading."`
	NoTLSResumption  bool          `name:"no-tls-resumption" help:"Agents keep no TLS session tickets, so every reconnect is a full handshake (the baseline; the real agent resumes)."`
	HTTP2            bool          `name:"http2" help:"Agents speak HTTP/2 instead of the framed node connection (drover-mux/1) the real agent uses (the baseline)."`
	ClientHandshakes int           `name:"client-handshakes" default:"64" help:"At most this many of the harness's client-side TLS handshakes at once (-1: no bound). The simulated agents share this machine's cores where real agents have their own; waiting for a slot counts in the figures."`
}

// Run implements the command.
func (c *BenchFleetCmd) Run(ctx context.Context, env *Env) error {
	warm := c.HeartbeatWarmup
	if warm == 0 {
		warm = -1 // bench.Config's "none"
	}
	cfg := bench.Config{Agents: c.Agents, LongPolls: c.LongPolls, HeartbeatAgents: c.HeartbeatAgents,
		HeartbeatRate: c.HeartbeatRate, Duration: c.Duration, HeartbeatWarmup: warm, Tasks: c.Tasks, DispatchSamples: c.DispatchSamples,
		Enqueue: c.Enqueue, BatchSize: c.BatchSize, TaskType: c.TaskType, ClaimMax: c.ClaimMax,
		Store: c.Store, ServerProcess: c.ServerProcess, ServerBin: c.ServerBin, ServerGOMAXPROCS: c.ServerProcs, ServerGOGC: c.ServerGOGC,
		KEKFile: c.KEKFile,
		NodeURL: c.NodeURL, API: c.API, Token: c.Token, CAHash: c.CAHash,
		CPUProfile: c.CPUProfile, MemProfile: c.MemProfile, Settle: c.Settle, Log: env.Stderr,
		ReconnectStorm: c.ReconnectStorm, NoTLSResumption: c.NoTLSResumption, ClientHandshakes: c.ClientHandshakes, HTTP2: c.HTTP2}
	if c.Quiet {
		cfg.Log = nil
	}
	if cfg.NodeURL != "" || cfg.API != "" {
		cfg.Store = ""
	}
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return err
	}
	b := buf.Bytes()
	if _, err := env.Stdout.Write(b); err != nil {
		return err
	}
	if c.Out != "" {
		if err := os.WriteFile(c.Out, b, 0o644); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
	}
	return nil
}
