package bench

// The measured phases of a fleet run: memory with the long-polls open,
// dispatch latency, claim+result throughput and heartbeats.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// memSample measures the control plane after a pause.
func (f *fleet) memSample(ctx context.Context) (MemSample, error) {
	sleep(ctx, f.cfg.Settle)
	if f.t.mode == ModeServerProcess {
		return childMem(ctx, f.t.pid, f.t.opURL+"/metrics")
	}
	return selfMem(), nil
}

// dispatch enqueues tasks one at a time to random long-polling agents and
// times enqueue → the agent's wait returning the delivery.
func (f *fleet) dispatch(ctx context.Context, pollers []*simAgent) error {
	n := f.cfg.DispatchSamples
	rng := mrand.New(mrand.NewPCG(f.cfg.Seed, 1))
	var lat, call recorder
	var errs int64
	params := json.RawMessage(`{}`)
	for i := range n {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a := pollers[rng.IntN(len(pollers))]
		cid := fmt.Sprintf("bench-%s-d%d", f.runID, i)
		p := f.track.add(cid)
		t0 := time.Now()
		err := f.op.call(ctx, http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: a.id,
			Type: f.cfg.TaskType, Params: params, CorrelationID: cid}, nil)
		call.add(time.Since(t0))
		if err != nil {
			errs++
			f.track.remove(cid)
			f.logf("dispatch enqueue: %v", err)
			continue
		}
		select {
		case at := <-p.delivered:
			lat.add(at.Sub(t0))
		case <-time.After(30 * time.Second):
			errs++
			f.logf("dispatch: task for %s not delivered in 30s", a.id)
		}
		// Let the agent post its result before the next sample.
		select {
		case r := <-p.done:
			if r.err != nil {
				errs++
			}
		case <-time.After(30 * time.Second):
			errs++
		}
		f.track.remove(cid)
	}
	f.rep.Dispatch = DispatchReport{LongPolls: len(pollers), Samples: n, Errors: errs, Latency: lat.summary(),
		EnqueueCall: call.summary(), CDF: lat.cdf()}
	f.logf("dispatch: %+v", f.rep.Dispatch.Latency)
	return nil
}

// throughput enqueues many tasks over the long-polling agents as fast as the
// operator API takes them; the agents claim them through their waits and
// post results at once.
func (f *fleet) throughput(ctx context.Context, pollers []*simAgent) error {
	n := f.cfg.Tasks
	pends := make([]*pending, n)
	cids := make([]string, n)
	for i := range n {
		cids[i] = fmt.Sprintf("bench-%s-t%d", f.runID, i)
		pends[i] = f.track.add(cids[i])
	}
	defer func() {
		for _, c := range cids {
			f.track.remove(c)
		}
	}()
	var enqErrs atomic.Int64
	cpu0, srv0 := selfCPU(), f.serverCPU()
	start := time.Now()
	if f.cfg.Enqueue == EnqueueBatch {
		bs := f.cfg.BatchSize
		_ = parallel(ctx, (n+bs-1)/bs, 8, func(b int) error {
			lo, hi := b*bs, min((b+1)*bs, n)
			req := api.EnqueueTaskBatchRequest{Items: make([]api.EnqueueTaskRequest, 0, hi-lo)}
			for i := lo; i < hi; i++ {
				req.Items = append(req.Items, api.EnqueueTaskRequest{NodeID: pollers[i%len(pollers)].id,
					Type: f.cfg.TaskType, Params: json.RawMessage(`{}`), CorrelationID: cids[i]})
			}
			t0 := time.Now()
			for i := lo; i < hi; i++ {
				pends[i].start = t0
			}
			if err := f.op.call(ctx, http.MethodPost, "/api/v1/tasks:batch", req, nil); err != nil {
				enqErrs.Add(int64(hi - lo))
				for i := lo; i < hi; i++ {
					pends[i].finish(time.Time{}, err)
				}
			}
			return nil
		})
	} else {
		_ = parallel(ctx, n, 8, func(i int) error {
			a := pollers[i%len(pollers)]
			pends[i].start = time.Now()
			if err := f.op.call(ctx, http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: a.id,
				Type: f.cfg.TaskType, Params: json.RawMessage(`{}`), CorrelationID: cids[i]}, nil); err != nil {
				enqErrs.Add(1)
				pends[i].finish(time.Time{}, err)
			}
			return nil
		})
	}
	enqDone := time.Since(start)
	var lat recorder
	var errs int64
	completed, afterEnq := 0, 0
	var last time.Time
	enqEnd := start.Add(enqDone)
	deadline := time.After(2*time.Minute + time.Duration(n)*time.Millisecond)
wait:
	for _, p := range pends {
		select {
		case r := <-p.done:
			if r.err != nil {
				errs++
				continue
			}
			completed++
			if r.at.After(enqEnd) {
				afterEnq++
			}
			lat.add(r.at.Sub(p.start))
			if r.at.After(last) {
				last = r.at
			}
		case <-deadline:
			f.logf("throughput: timed out with %d of %d results", completed, n)
			break wait
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cpu, srv := selfCPU()-cpu0, f.serverCPU()-srv0
	el := last.Sub(start)
	f.rep.Throughput = ThroughputReport{Tasks: n, Completed: completed, Errors: errs, ElapsedS: secs(el),
		TasksPerSec: perSec(completed, el), EnqueuePerSec: perSec(n-int(enqErrs.Load()), enqDone),
		EnqueueToResult: lat.summary(), Enqueue: f.cfg.Enqueue, TaskType: f.cfg.TaskType, ClaimMax: f.cfg.ClaimMax, EnqueueS: secs(enqDone), HarnessCPUS: round2(cpu)}
	if f.t.mode == ModeServerProcess {
		f.rep.Throughput.ServerCPUS = round2(srv)
	}
	if completed > 0 {
		f.rep.Throughput.HarnessCPUPerTaskUs = round2(cpu / float64(completed) * 1e6)
		f.rep.Throughput.ServerCPUPerTaskUs = round2(f.rep.Throughput.ServerCPUS / float64(completed) * 1e6)
	}
	if f.cfg.Enqueue == EnqueueBatch {
		f.rep.Throughput.BatchSize = f.cfg.BatchSize
	}
	if last.After(enqEnd) {
		f.rep.Throughput.DrainPerSec = perSec(afterEnq, last.Sub(enqEnd))
	}
	f.logf("throughput (%s enqueue): %d tasks in %.2fs = %.0f/s, enqueue %.0f/s, cpu µs/task server %.0f harness %.0f",
		f.cfg.Enqueue, completed, secs(el), f.rep.Throughput.TasksPerSec, f.rep.Throughput.EnqueuePerSec,
		f.rep.Throughput.ServerCPUPerTaskUs, f.rep.Throughput.HarnessCPUPerTaskUs)
	return nil
}

// heartbeats runs the heartbeat phase: closed loop (every agent sends its
// next heartbeat as soon as the last was answered) or, with HeartbeatRate,
// open loop (each agent on a fixed schedule; latency counts from the
// scheduled time, so a late send is not hidden).
func (f *fleet) heartbeats(ctx context.Context) {
	hbAgents := f.agents[:f.cfg.HeartbeatAgents]
	// The simulated agents were silent through the phases before this one;
	// real ones heartbeat all along. Bring their liveness up to date first,
	// or the server has marked them stale and each agent's first heartbeat
	// here is a stale → healthy transition (a host-row write and an audit
	// record) that a fleet heartbeating all along does not have.
	if err := f.beatAll(ctx, "heartbeats", hbAgents); err != nil {
		f.logf("heartbeats: warm-up: %v", err)
	}
	d, warm := f.cfg.Duration, f.cfg.HeartbeatWarmup
	var lat recorder
	var count, errs atomic.Int64
	seconds := int((d + time.Second - 1) / time.Second)
	perSecond := make([]atomic.Int64, seconds)
	var wg sync.WaitGroup
	restoreGC := pauseHarnessGC(f.rep.Machine.MemTotalKB)
	// The agents heartbeat from launch; what is scheduled before start
	// (the warm-up) is neither counted nor timed.
	launch := time.Now()
	start := launch.Add(warm)
	deadline := start.Add(d)
	closed := f.cfg.HeartbeatRate <= 0
	var period time.Duration
	if !closed {
		period = time.Duration(float64(len(hbAgents)) / f.cfg.HeartbeatRate * float64(time.Second))
	}
	for i, a := range hbAgents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each agent keeps its own samples until the end: one lock
			// for every heartbeat of the fleet would queue the agents on
			// it (the harness's own lock convoy).
			var mine []timedSample
			defer func() { lat.addTimed(mine) }()
			next := launch
			if !closed {
				next = launch.Add(period * time.Duration(i) / time.Duration(len(hbAgents)))
			}
			for ctx.Err() == nil {
				if closed {
					next = time.Now()
				} else {
					sleep(ctx, time.Until(next))
				}
				if !next.Before(deadline) {
					return
				}
				err := a.heartbeat(ctx)
				now := time.Now()
				counted := !next.Before(start)
				if err != nil {
					if counted {
						errs.Add(1)
					}
					sleep(ctx, 50*time.Millisecond)
				} else if counted {
					mine = append(mine, timedSample{at: int32(min(next.Sub(start)/time.Second, time.Duration(seconds-1))), d: now.Sub(next)})
					if !now.After(deadline) {
						count.Add(1)
						perSecond[min(int(now.Sub(start)/time.Second), len(perSecond)-1)].Add(1)
					}
				}
				next = next.Add(period)
			}
		}()
	}
	sleep(ctx, time.Until(start))
	metrics0, metricsErr := scrapeMetrics(ctx, f.t.opURL+"/metrics")
	rt0, rtErr := f.serverRuntime(ctx)
	cpu0, srv0 := selfCPU(), f.serverCPU()
	wg.Wait()
	gc := restoreGC()
	hb := HeartbeatReport{Agents: len(hbAgents), Mode: "closed-loop", DurationS: d.Seconds(), Count: count.Load(),
		Errors: errs.Load(), PerSec: perSec(int(count.Load()), d), Latency: lat.summary(),
		WarmupS: warm.Seconds(), HarnessGC: &gc, PerSecondP99Ms: lat.p99PerSecond(seconds)}
	if !closed {
		hb.Mode, hb.OfferedPerSec = "open-loop", f.cfg.HeartbeatRate
	}
	for i := range perSecond {
		hb.PerSecond = append(hb.PerSecond, perSecond[i].Load())
	}
	if m, err := scrapeMetrics(ctx, f.t.opURL+"/metrics"); err == nil && metricsErr == nil {
		hb.StatusChanges = statusChanges(m, metrics0)
	}
	hb.HarnessCPUS = round2(selfCPU() - cpu0)
	if f.t.mode == ModeServerProcess {
		hb.ServerCPUS = round2(f.serverCPU() - srv0)
	}
	if n := lat.len(); n > 0 {
		hb.HarnessCPUPerBeatUs = round2(hb.HarnessCPUS / float64(n) * 1e6)
		hb.ServerCPUPerBeatUs = round2(hb.ServerCPUS / float64(n) * 1e6)
		if rt1, err := f.serverRuntime(ctx); err == nil && rtErr == nil && f.t.mode == ModeServerProcess {
			hb.Server = &ServerRuntime{GCCycles: rt1.gcCycles - rt0.gcCycles, GCPauseS: round2(rt1.gcPauseS - rt0.gcPauseS),
				AllocsPerBeat: round2((rt1.mallocs - rt0.mallocs) / float64(n)), AllocBytesPerBeat: round2((rt1.allocBytes - rt0.allocBytes) / float64(n))}
			if m, err := childMem(ctx, f.t.pid, f.t.opURL+"/metrics"); err == nil {
				hb.Server.RSSBytesEnd, hb.Server.HeapInuseBytesEnd, hb.Server.GoroutinesEnd = m.RSSBytes, m.HeapInuseBytes, m.Goroutines
			}
		}
	}
	f.rep.Heartbeats = hb
	f.logf("heartbeats: %d in %s = %.0f/s, %+v", hb.Count, d, hb.PerSec, hb.Latency)
}

// serverRuntime reads the server child's runtime counters (zero, and an
// error, in the other modes).
func (f *fleet) serverRuntime(ctx context.Context) (runtimeCounters, error) {
	if f.t.mode != ModeServerProcess {
		return runtimeCounters{}, errors.New("not a server process")
	}
	return childRuntime(ctx, f.t.opURL+"/metrics")
}

func (f *fleet) serverCPU() float64 {
	if f.t.pid == 0 {
		return 0
	}
	return procCPU(f.t.pid)
}
