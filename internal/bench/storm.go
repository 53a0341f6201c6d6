package bench

// The reconnect storm: the server child is SIGKILLed and started again on
// the same store and addresses while every simulated agent tries to come
// back (new TCP connection, TLS 1.3 handshake, resumed unless
// NoTLSResumption, one heartbeat), and the storm probe (a process of its
// own, probe.go) polls readiness and keeps reading hosts.

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TargetStormAgents and TargetStormBackS are the reconnect-storm target:
// 20 000 agents back within 15 s of a control-plane restart.
const (
	TargetStormAgents = 20000
	TargetStormBackS  = 15
	TargetStormAPIP99 = 1000 // operator API p99 during the storm, ms
)

// StormReport is the reconnect-storm phase. Times are seconds from the
// SIGKILL; an agent is back when a heartbeat over a new connection is
// answered 200.
type StormReport struct {
	Agents int `json:"agents"`
	Back   int `json:"back"`
	// RestartS is SIGKILL → the new server's /readyz answering 200, as the
	// storm probe (a process of its own) saw it; HarnessReadyS as the
	// harness did, queued behind its agents' goroutines.
	RestartS      float64 `json:"restart_s"`
	HarnessReadyS float64 `json:"harness_ready_s"`
	P50S          float64 `json:"p50_s"`
	P90S          float64 `json:"p90_s"`
	P99S          float64 `json:"p99_s"`
	P100S         float64 `json:"p100_s"`
	// FailedAttempts counts heartbeats that failed during the storm
	// (refused connections while the server was down included).
	FailedAttempts int64 `json:"failed_attempts"`
	// Curve is the cumulative number of agents back, every 100 ms.
	Curve []CurvePoint `json:"curve"`
	// Operator is GET /api/v1/hosts/{id} in a loop, by the storm probe,
	// from the kill until the last agent is back: latency of the answered
	// calls.
	Operator      Latency `json:"operator"`
	OperatorFails int64   `json:"operator_failed"` // refused while down, timed out or non-2xx
	// TLSResumption: the agents kept session tickets (not
	// --no-tls-resumption). Handshakes are the new server's node-listener
	// handshakes by result, from its metrics after the storm.
	TLSResumption bool           `json:"tls_resumption"`
	Handshakes    map[string]int `json:"handshakes,omitempty"`
	// StatusChanges are the new server's host status transitions by new
	// status during the storm (drover_host_status_changes_total): hosts
	// marked stale while their agents were still reconnecting show here.
	StatusChanges map[string]int `json:"status_changes,omitempty"`
	ServerCPUS    float64        `json:"server_cpu_s,omitempty"`
	HarnessCPUS   float64        `json:"harness_cpu_s,omitempty"`
	// StealS is the CPU time the hypervisor gave to other guests from the
	// kill until the last agent was back, all CPUs together (/proc/stat):
	// on a shared VM, time the server and harness were runnable but did
	// not run.
	StealS      float64 `json:"steal_s"`
	RSSBytesEnd int64   `json:"server_rss_bytes_end,omitempty"`
}

// CurvePoint is one point of a cumulative curve.
type CurvePoint struct {
	T float64 `json:"t_s"`
	N int     `json:"n"`
}

// stormBackoff mirrors the real agent's heartbeat retry (internal/node/agent:
// capped exponential backoff from 1 s to 1 min, delay uniform in
// [0.75, 1.25) × the current step).
func stormBackoff(step time.Duration, rng *mrand.Rand) (time.Duration, time.Duration) {
	d := step*3/4 + time.Duration(rng.Int64N(int64(step/2)+1))
	return d, min(2*step, time.Minute)
}

// storm runs the reconnect storm; the long-polls stay in place and
// reconnect on their own (their errors are not counted here).
func (f *fleet) storm(ctx context.Context) error {
	if f.t.restart == nil {
		return errors.New("the reconnect storm needs --server-process")
	}
	n := len(f.agents)
	// The simulated agents heartbeat only in the heartbeat phase; real ones
	// do every interval. Bring every host's liveness up to date first, or
	// the old server has marked most of them stale before the kill and
	// every reconnect is a stale → healthy transition (a host-row write and
	// an audit record) that a real fleet would not have.
	if err := f.beatAll(ctx, "reconnect storm", f.agents); err != nil {
		return fmt.Errorf("reconnect storm: heartbeat every agent before the kill: %w", err)
	}
	backAt := make([]atomic.Int64, n) // ns since the kill; 0: not back
	var failed atomic.Int64
	var t0 time.Time
	killedCh := make(chan struct{})
	cpu0, steal0 := selfCPU(), stealS()
	// The operator calls and the readiness poll run in a process of their
	// own (probe.go); the harness's own readiness wait still sequences it.
	hosts := make([]string, 0, 64)
	for i := 0; i < n && len(hosts) < 64; i += max(1, n/64) {
		hosts = append(hosts, f.agents[i].id)
	}
	exe, err := os.Executable() // this drover binary: `drover bench storm-probe`
	if err != nil {
		return fmt.Errorf("find the drover executable: %w", err)
	}
	probe, err := startProbe(exe, f.t.opURL, f.t.token, hosts)
	if err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond) // the probe is up and reading before the kill
	restartErr := make(chan error, 1)
	go func() {
		restartErr <- f.t.restart(ctx, func() { t0 = time.Now(); close(killedCh) })
	}()
	<-killedCh
	f.logf("reconnect storm: server killed; %d agents reconnecting", n)

	var wg sync.WaitGroup
	for i, a := range f.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(f.cfg.Seed, uint64(i)+2))
			step := time.Second
			for ctx.Err() == nil {
				if err := a.heartbeat(ctx); err == nil {
					backAt[i].Store(int64(max(time.Since(t0), 1)))
					return
				}
				failed.Add(1)
				var d time.Duration
				d, step = stormBackoff(step, rng)
				sleep(ctx, d)
			}
		}()
	}
	var rerr error
	select {
	case rerr = <-restartErr:
	case <-ctx.Done():
		rerr = ctx.Err()
	}
	harnessReadyS := time.Since(t0)
	if rerr != nil {
		_, _ = probe.stop()
		return fmt.Errorf("reconnect storm: restart: %w", rerr)
	}
	f.logf("reconnect storm: the harness saw the server ready again after %.2fs", secs(harnessReadyS))
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-ctx.Done():
			break wait
		case <-tick.C:
			c := 0
			for i := range backAt {
				if backAt[i].Load() > 0 {
					c++
				}
			}
			f.logf("reconnect storm: %d/%d agents back at %.0fs", c, n, time.Since(t0).Seconds())
		}
	}
	wg.Wait()
	events, perr := probe.stop()
	if perr != nil {
		return perr
	}
	var op recorder
	restartS, opFails := probeFigures(events, t0, &op)

	rep := &StormReport{Agents: n, RestartS: restartS, HarnessReadyS: secs(harnessReadyS), FailedAttempts: failed.Load(),
		TLSResumption: !f.cfg.NoTLSResumption, Operator: op.summary(), OperatorFails: opFails}
	var back []time.Duration
	for i := range backAt {
		if d := time.Duration(backAt[i].Load()); d > 0 {
			back = append(back, d)
		}
	}
	slices.Sort(back)
	rep.Back = len(back)
	if len(back) > 0 {
		// Percentiles of the whole fleet: an agent not back counts as never.
		q := func(p float64) float64 {
			k := int(p / 100 * float64(n))
			if k < 1 {
				k = 1
			}
			if k > len(back) {
				return -1
			}
			return secs(back[k-1])
		}
		rep.P50S, rep.P90S, rep.P99S, rep.P100S = q(50), q(90), q(99), q(100)
		rep.Curve = cumulative(back, 100*time.Millisecond)
	}
	rep.HarnessCPUS = round2(selfCPU() - cpu0)
	rep.StealS = round2(stealS() - steal0)
	if f.t.pid != 0 {
		// The new child's CPU only (the killed one's is gone with it).
		rep.ServerCPUS = round2(f.serverCPU())
		if m, err := childMem(ctx, f.t.pid, f.t.opURL+"/metrics"); err == nil {
			rep.RSSBytesEnd = m.RSSBytes
		}
		if m, err := scrapeMetrics(ctx, f.t.opURL+"/metrics"); err == nil {
			rep.Handshakes = map[string]int{}
			for _, r := range []string{"full", "resumed", "failed"} {
				rep.Handshakes[r] = int(m[`drover_node_tls_handshakes_total{result="`+r+`"}`])
			}
			rep.StatusChanges = statusChanges(m, nil)
		}
	}
	f.rep.Storm = rep
	f.logf("reconnect storm: %d/%d back; 50%% %.2fs 90%% %.2fs 99%% %.2fs 100%% %.2fs (restart %.2fs); operator p50 %.1fms p99 %.1fms (%d answered, %d failed); handshakes %v; CPU server %.2fs harness %.2fs stolen %.2fs",
		rep.Back, n, rep.P50S, rep.P90S, rep.P99S, rep.P100S, rep.RestartS, rep.Operator.P50Ms, rep.Operator.P99Ms,
		rep.Operator.Count, rep.OperatorFails, rep.Handshakes, rep.ServerCPUS, rep.HarnessCPUS, rep.StealS)
	return nil
}

// beatAll sends one heartbeat from each of agents, 256 at a time, then
// waits one heartbeat interval, so the server has flushed them to the
// store as it does every interval: every host was last seen, as stored,
// about one interval ago, as in a fleet heartbeating all along. phase
// names the caller in the log.
func (f *fleet) beatAll(ctx context.Context, phase string, agents []*simAgent) error {
	start := time.Now()
	var (
		wg       sync.WaitGroup
		failed   atomic.Int64
		next     atomic.Int64
		interval atomic.Int64
	)
	for range 256 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(agents) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				a := agents[i]
				resp, err := a.nc.Heartbeat(ctx, a.id, benchHeartbeat())
				if err != nil {
					failed.Add(1)
					continue
				}
				interval.Store(int64(resp.HeartbeatInterval))
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d of %d heartbeats failed", n, len(agents))
	}
	iv := time.Duration(interval.Load())
	f.logf("%s: every agent heartbeated (%.2fs); waiting %s for the server's flush",
		phase, time.Since(start).Seconds(), iv)
	sleep(ctx, iv+iv/10)
	return ctx.Err()
}

// statusChanges is the server's host status transitions to stale and to
// healthy counted in the metrics m, less those in base (nil: none).
func statusChanges(m, base map[string]float64) map[string]int {
	out := map[string]int{}
	for _, st := range []api.HostStatus{api.HostStale, api.HostHealthy} {
		k := `drover_host_status_changes_total{status="` + string(st) + `"}`
		out[string(st)] = int(m[k] - base[k])
	}
	return out
}

// cumulative turns sorted times into (t, count ≤ t) every step, up to the last.
func cumulative(sorted []time.Duration, step time.Duration) []CurvePoint {
	if len(sorted) == 0 {
		return nil
	}
	var out []CurvePoint
	j := 0
	for t := time.Duration(0); ; t += step {
		for j < len(sorted) && sorted[j] <= t {
			j++
		}
		out = append(out, CurvePoint{T: secs(t), N: j})
		if j == len(sorted) {
			return out
		}
	}
}
