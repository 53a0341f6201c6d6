package bench

import (
	"errors"
	"fmt"
	"math"
)

// Targets from the fleet-scale issue.
const (
	TargetHeartbeatsPerSec     = 20000
	TargetHeartbeatP99Ms       = 50
	TargetDispatchP50Ms        = 2
	TargetDispatchP99Ms        = 10
	TargetDispatchLongPolls    = 10000
	TargetBytesPerIdleLongPoll = 10 * 1024
)

// Report is what `drover bench fleet` prints.
type Report struct {
	Machine    Machine          `json:"machine"`
	Config     ReportConfig     `json:"config"`
	Setup      SetupReport      `json:"setup"`
	Memory     *MemoryReport    `json:"memory,omitempty"`
	Dispatch   DispatchReport   `json:"dispatch"`
	Throughput ThroughputReport `json:"throughput"`
	Heartbeats HeartbeatReport  `json:"heartbeats"`
	Storm      *StormReport     `json:"reconnect_storm,omitempty"`
	Targets    []TargetResult   `json:"targets"`
}

// Machine describes where the run happened.
type Machine struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	CPUModel   string `json:"cpu_model,omitempty"`
	Kernel     string `json:"kernel,omitempty"`
	MemTotalKB int64  `json:"mem_total_kb,omitempty"`
	// LoadAvg is /proc/loadavg at the start and the end of the run: other
	// work on the machine shows here.
	LoadAvgStart string `json:"loadavg_start,omitempty"`
	LoadAvgEnd   string `json:"loadavg_end,omitempty"`
}

// ReportConfig echoes the run's parameters.
type ReportConfig struct {
	Mode             string  `json:"mode"` // in-process | server-process | external
	Store            string  `json:"store"`
	Agents           int     `json:"agents"`
	LongPolls        int     `json:"long_polls"`
	HeartbeatAgents  int     `json:"heartbeat_agents"`
	HeartbeatRate    float64 `json:"heartbeat_rate"` // offered heartbeats/s; 0 = closed loop
	DurationS        float64 `json:"duration_s"`
	Tasks            int     `json:"tasks"`
	DispatchSamples  int     `json:"dispatch_samples"`
	Enqueue          string  `json:"enqueue"` // throughput phase: single | batch
	NoFileLimit      uint64  `json:"nofile_limit"`
	ServerGOMAXPROCS int     `json:"server_gomaxprocs,omitempty"`
	ServerGOGC       string  `json:"server_gogc,omitempty"`
	// ClientHandshakes is the harness's bound on concurrent client
	// handshakes (-1: none).
	ClientHandshakes int `json:"client_handshakes"`
}

// SetupReport times host creation and enrolment.
type SetupReport struct {
	HostsCreated  int     `json:"hosts_created"`
	CreateHostsS  float64 `json:"create_hosts_s"`
	Enrolled      int     `json:"enrolled"`
	EnrolS        float64 `json:"enrol_s"`
	EnrolPerSec   float64 `json:"enrol_per_sec"`
	RegisterRetry int64   `json:"register_retries"`
	ConnectS      float64 `json:"connect_s"` // first mTLS heartbeat of every agent
	ConnectErrors int64   `json:"connect_errors"`
}

// HeartbeatReport is the heartbeat phase.
type HeartbeatReport struct {
	Agents        int     `json:"agents"`
	Mode          string  `json:"mode"` // closed-loop | open-loop
	OfferedPerSec float64 `json:"offered_per_sec,omitempty"`
	DurationS     float64 `json:"duration_s"`
	Count         int64   `json:"count"`
	Errors        int64   `json:"errors"`
	PerSec        float64 `json:"per_sec"`
	Latency       Latency `json:"latency"`
	// PerSecond is the heartbeats answered in each second of the phase,
	// and PerSecondP99Ms the 99th percentile latency of those scheduled in
	// each (where the stalls are).
	PerSecond      []int64   `json:"per_second,omitempty"`
	PerSecondP99Ms []float64 `json:"per_second_p99_ms,omitempty"`
	// LongPollsOpen is how many idle long-polls stayed open meanwhile.
	LongPollsOpen int `json:"long_polls_open"`
	// StatusChanges are the host status transitions during the phase, by
	// new status (after a warm-up heartbeat from every agent, so any here
	// are hosts the server marked stale because it fell behind).
	StatusChanges map[string]int `json:"status_changes,omitempty"`
	// CPU seconds used during the phase (server-process mode splits them).
	ServerCPUS  float64 `json:"server_cpu_s,omitempty"`
	HarnessCPUS float64 `json:"harness_cpu_s,omitempty"`
	// CPU time per heartbeat answered: load-independent cost figures.
	ServerCPUPerBeatUs  float64 `json:"server_cpu_us_per_heartbeat,omitempty"`
	HarnessCPUPerBeatUs float64 `json:"harness_cpu_us_per_heartbeat,omitempty"`
	// Server is the server child's Go runtime over the phase
	// (server-process mode only).
	Server *ServerRuntime `json:"server,omitempty"`
	// WarmupS is how long the agents heartbeated at the offered rate
	// before the phase's counts, latencies and CPU figures began.
	WarmupS float64 `json:"warmup_s,omitempty"`
	// HarnessGC is what the harness's own garbage collector did.
	HarnessGC *HarnessGC `json:"harness_gc,omitempty"`
}

// HarnessGC is how the harness ran its own garbage collector during the
// heartbeat phase (pauseHarnessGC).
type HarnessGC struct {
	Mode   string `json:"mode"`
	Cycles uint32 `json:"cycles"`
}

// ServerRuntime is what the server's garbage collector and allocator did
// during the heartbeat phase, from its /metrics (whole process: TLS,
// HTTP/2 and the open long-polls included), and its size at the end.
type ServerRuntime struct {
	GCCycles          float64 `json:"gc_cycles"`
	GCPauseS          float64 `json:"gc_pause_s"` // stop-the-world pauses, summed
	AllocsPerBeat     float64 `json:"allocs_per_heartbeat"`
	AllocBytesPerBeat float64 `json:"alloc_bytes_per_heartbeat"`
	RSSBytesEnd       int64   `json:"rss_bytes_end"`
	HeapInuseBytesEnd int64   `json:"heap_inuse_bytes_end"`
	GoroutinesEnd     int64   `json:"goroutines_end"`
}

// DispatchReport is enqueue → agent-receives latency with idle long-polls.
type DispatchReport struct {
	LongPolls int     `json:"long_polls"`
	Samples   int     `json:"samples"`
	Errors    int64   `json:"errors"`
	Latency   Latency `json:"latency"`
	// EnqueueCall is the operator API call alone (request → 201).
	EnqueueCall Latency `json:"enqueue_call"`
	// CDF is the latency distribution: the latency at each quantile.
	CDF []Quantile `json:"cdf,omitempty"`
}

// ThroughputReport is claim+result throughput.
type ThroughputReport struct {
	Tasks           int     `json:"tasks"`
	Completed       int     `json:"completed"`
	Errors          int64   `json:"errors"`
	ElapsedS        float64 `json:"elapsed_s"`
	TasksPerSec     float64 `json:"tasks_per_sec"`
	EnqueuePerSec   float64 `json:"enqueue_per_sec"`
	EnqueueToResult Latency `json:"enqueue_to_result"`
	// Enqueue is single or batch; BatchSize the tasks per batch call.
	Enqueue   string `json:"enqueue"`
	TaskType  string `json:"task_type"`
	BatchSize int    `json:"batch_size,omitempty"`
	// ClaimMax is the most tasks one long-poll claimed (?max=N).
	ClaimMax int `json:"claim_max"`
	// EnqueueS is first enqueue call → last enqueue answered.
	EnqueueS float64 `json:"enqueue_s"`
	// DrainPerSec is the claim+result rate once every task was queued:
	// results after the last enqueue answered / (last result − that
	// moment). With batch enqueue it is the claim+result path alone.
	DrainPerSec float64 `json:"drain_per_sec,omitempty"`
	// HarnessCPUS and ServerCPUS are the CPU seconds this process and (with
	// --server-process) the server child used from the first enqueue to the
	// last result; the per-task figures divide them by Completed. In
	// process the harness figure includes the server.
	HarnessCPUS         float64 `json:"harness_cpu_s"`
	ServerCPUS          float64 `json:"server_cpu_s,omitempty"`
	HarnessCPUPerTaskUs float64 `json:"harness_cpu_us_per_task"`
	ServerCPUPerTaskUs  float64 `json:"server_cpu_us_per_task,omitempty"`
}

// MemSample is one memory observation of the control plane.
type MemSample struct {
	RSSBytes        int64 `json:"rss_bytes"`
	HeapInuseBytes  int64 `json:"heap_inuse_bytes"`
	StackInuseBytes int64 `json:"stack_inuse_bytes"`
	Goroutines      int64 `json:"goroutines"`
}

// MemoryReport compares the control plane with 0 and N idle long-polls.
type MemoryReport struct {
	// Source is "server-process" (the control plane alone, read from
	// /proc/<pid>/status and its /metrics) or "in-process" (includes the
	// simulated agents' client side: an upper bound, not a server figure).
	Source          string    `json:"source"`
	IncludesClients bool      `json:"includes_clients"`
	LongPolls       int       `json:"long_polls"`
	NoConnections   MemSample `json:"no_connections"`
	IdleConnections MemSample `json:"idle_connections"`
	LongPollsOpen   MemSample `json:"long_polls_open"`
	// Per idle long-poll, counting its mTLS connection (long_polls_open −
	// no_connections) / N: what one more idle agent costs.
	RSSPerLongPoll       float64 `json:"rss_bytes_per_long_poll"`
	HeapStackPerLongPoll float64 `json:"heap_stack_bytes_per_long_poll"`
	// Per idle long-poll on an already open connection (long_polls_open −
	// idle_connections) / N: the request alone.
	RSSPerRequest         float64 `json:"rss_bytes_per_request_only"`
	HeapStackPerRequest   float64 `json:"heap_stack_bytes_per_request_only"`
	GoroutinesPerLongPoll float64 `json:"goroutines_per_long_poll"`
}

// TargetResult compares one figure with its target.
type TargetResult struct {
	Name     string  `json:"name"`
	Target   string  `json:"target"`
	Measured float64 `json:"measured"`
	Unit     string  `json:"unit"`
	Met      bool    `json:"met"`
	Note     string  `json:"note,omitempty"`
}

func per(delta int64, n int) float64 {
	if n <= 0 {
		return 0
	}
	return math.Round(float64(delta)/float64(n)*10) / 10
}

// computeMemory fills the per-long-poll figures.
func (m *MemoryReport) compute() {
	n := m.LongPolls
	m.RSSPerLongPoll = per(m.LongPollsOpen.RSSBytes-m.NoConnections.RSSBytes, n)
	m.HeapStackPerLongPoll = per(m.LongPollsOpen.HeapInuseBytes+m.LongPollsOpen.StackInuseBytes-
		m.NoConnections.HeapInuseBytes-m.NoConnections.StackInuseBytes, n)
	m.RSSPerRequest = per(m.LongPollsOpen.RSSBytes-m.IdleConnections.RSSBytes, n)
	m.HeapStackPerRequest = per(m.LongPollsOpen.HeapInuseBytes+m.LongPollsOpen.StackInuseBytes-
		m.IdleConnections.HeapInuseBytes-m.IdleConnections.StackInuseBytes, n)
	m.GoroutinesPerLongPoll = per(m.LongPollsOpen.Goroutines-m.NoConnections.Goroutines, n)
}

// evaluate compares the report with the targets.
func (r *Report) evaluate() {
	r.Targets = nil
	hb := r.Heartbeats
	note := ""
	if hb.Mode == "closed-loop" {
		note = fmt.Sprintf("closed loop with %d concurrent agents: p99 includes queueing behind them", hb.Agents)
	}
	r.Targets = append(r.Targets,
		TargetResult{Name: "heartbeats_per_sec", Target: ">= 20000", Measured: hb.PerSec, Unit: "1/s",
			Met: hb.PerSec >= TargetHeartbeatsPerSec, Note: note},
		TargetResult{Name: "heartbeat_p99", Target: "< 50 ms", Measured: hb.Latency.P99Ms, Unit: "ms",
			Met: hb.Count > 0 && hb.Latency.P99Ms < TargetHeartbeatP99Ms, Note: note})
	d := r.Dispatch
	dnote := ""
	if d.LongPolls < TargetDispatchLongPolls {
		dnote = fmt.Sprintf("measured with %d idle long-polls; the target is stated for %d", d.LongPolls, TargetDispatchLongPolls)
	}
	r.Targets = append(r.Targets,
		TargetResult{Name: "dispatch_p50", Target: "<= 2 ms", Measured: d.Latency.P50Ms, Unit: "ms",
			Met: d.Latency.Count > 0 && d.Latency.P50Ms <= TargetDispatchP50Ms, Note: dnote},
		TargetResult{Name: "dispatch_p99", Target: "<= 10 ms", Measured: d.Latency.P99Ms, Unit: "ms",
			Met: d.Latency.Count > 0 && d.Latency.P99Ms <= TargetDispatchP99Ms, Note: dnote})
	if m := r.Memory; m != nil {
		mnote := "per long-poll including its mTLS connection; server process only"
		if m.IncludesClients {
			mnote = "in-process: includes the simulated agents' client side; use --server-process for the server alone"
		}
		r.Targets = append(r.Targets, TargetResult{Name: "server_bytes_per_idle_long_poll", Target: "<= 10240 B",
			Measured: m.RSSPerLongPoll, Unit: "B", Met: m.RSSPerLongPoll <= TargetBytesPerIdleLongPoll, Note: mnote})
	}
}

// Check reports what is missing or zero in a report (the smoke test uses it).
func (r *Report) Check() error {
	var errs []error
	bad := func(cond bool, what string) {
		if cond {
			errs = append(errs, errors.New(what))
		}
	}
	bad(r.Machine.NumCPU == 0, "machine.num_cpu is 0")
	bad(r.Config.Agents == 0, "config.agents is 0")
	bad(r.Setup.Enrolled != r.Config.Agents, fmt.Sprintf("enrolled %d of %d agents", r.Setup.Enrolled, r.Config.Agents))
	bad(r.Heartbeats.Count == 0 || r.Heartbeats.PerSec == 0, "no heartbeats")
	bad(r.Heartbeats.Latency.P50Ms == 0 || r.Heartbeats.Latency.P99Ms == 0, "heartbeat latency missing")
	bad(r.Dispatch.Latency.Count != r.Dispatch.Samples || r.Dispatch.Samples == 0, "dispatch samples missing")
	bad(r.Dispatch.Latency.P50Ms == 0 || r.Dispatch.Latency.P99Ms == 0, "dispatch latency missing")
	bad(r.Throughput.Completed != r.Throughput.Tasks || r.Throughput.TasksPerSec == 0, "throughput tasks not all completed")
	bad(r.Memory == nil, "memory missing")
	if r.Memory != nil {
		bad(r.Memory.LongPollsOpen.RSSBytes == 0 || r.Memory.NoConnections.RSSBytes == 0, "memory rss missing")
		bad(r.Memory.LongPollsOpen.Goroutines == 0, "memory goroutines missing")
	}
	bad(len(r.Targets) == 0, "targets missing")
	return errors.Join(errs...)
}
