package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// worker owns one instance: its goroutine is the only one that calls the
// runtime for that id, so calls on one instance are one at a time. All
// fields but kick are owned by that goroutine.
type worker struct {
	r    *Reconciler
	id   string
	log  *slog.Logger
	kick chan struct{} // capacity 1: run a pass soon

	d       api.DesiredInstance // last desired record seen (zero if never)
	exists  bool                // the runtime has the instance
	st      runtime.Status      // its last status, when exists
	gen     int64               // generation it was created for; 0: adopted, not yet matched
	secrets []string            // secret names it was created with; nil: unknown
	running bool                // we believe its process runs (started or adopted running)

	cur    status // what we would report now
	last   statusKey
	lastOK bool // last holds the last successful report

	bootDeadline   time.Time
	nextProbe      time.Time
	probeFails     int
	retryAt        time.Time // no Create/Start before this
	startFails     int       // consecutive failed creates/starts
	restartPending bool      // the next Start is a restart
	restartTimes   []time.Time
	restarts       int    // restarts since it was created
	stopNote       string // how the last stop went, for the Stopped report
}

type status struct {
	gen     int64
	phase   api.InstancePhase
	reason  api.ReasonCode
	message string
}

type statusKey struct {
	gen    int64
	phase  api.InstancePhase
	reason api.ReasonCode
}

func newWorker(r *Reconciler, id string, adopted *runtime.Status) *worker {
	w := &worker{r: r, id: id, log: r.log.With("instance", id), kick: make(chan struct{}, 1)}
	if adopted != nil {
		w.exists = true
		w.st = *adopted
		w.running = adopted.State == runtime.StateRunning
	}
	return w
}

func (w *worker) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *worker) now() time.Time { return w.r.opts.Now() }

// run makes passes until ctx ends (false) or the instance is forgotten
// (true).
func (w *worker) run(ctx context.Context) bool {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		forgotten, wakeAt := w.pass(ctx)
		if forgotten {
			return true
		}
		timer.Stop()
		if !wakeAt.IsZero() {
			timer.Reset(max(wakeAt.Sub(w.now()), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return false
		case <-w.kick:
		case <-timer.C:
		}
	}
}

// pass converges the instance one step and returns whether it is forgotten
// and when it wants its next pass (zero: on the next event or tick).
func (w *worker) pass(ctx context.Context) (forgotten bool, wakeAt time.Time) {
	d, inSet, draining, have := w.r.desiredOf(w.id)
	if inSet {
		w.d = d
	}
	if err := w.refresh(ctx); err != nil {
		if ctx.Err() == nil {
			w.log.Warn("inspect failed", "err", err)
		}
		return false, time.Time{}
	}
	if !have {
		w.publish()
		return false, time.Time{}
	}
	switch {
	case !inSet || d.DesiredState == api.DesiredDeleted:
		return w.remove(ctx, inSet), time.Time{}
	case d.DesiredState == api.DesiredStopped:
		w.halt(ctx, api.ReasonTerminatedByOperator)
	case draining:
		w.halt(ctx, api.ReasonNodeDraining)
	case d.DesiredState == api.DesiredRunning || d.DesiredState == "":
		wakeAt = w.converge(ctx)
	default:
		w.log.Warn("unknown desired state; leaving the instance as it is", "desired_state", d.DesiredState)
	}
	w.flush(ctx) // retries a report that failed earlier
	w.publish()
	return false, wakeAt
}

// refresh reads the instance's status from the runtime.
func (w *worker) refresh(ctx context.Context) error {
	st, err := w.r.rt.Inspect(ctx, w.id)
	switch {
	case errors.Is(err, runtime.ErrNotFound):
		w.exists, w.st = false, runtime.Status{}
		return nil
	case err != nil:
		return err
	}
	w.exists, w.st = true, st
	return nil
}

// converge drives a desired-running instance towards Ready.
func (w *worker) converge(ctx context.Context) time.Time {
	d := w.d
	if w.exists && w.gen != d.Generation {
		if w.specChanged(d) {
			w.log.Info("spec changed; recreating", "generation", d.Generation)
			if err := w.teardown(ctx, d); err != nil {
				w.logErr(ctx, "recreate: tear down", err)
				return time.Time{}
			}
		} else {
			w.gen = d.Generation
		}
	}
	if !w.exists {
		if w.now().Before(w.retryAt) {
			return w.retryAt
		}
		if !w.create(ctx, d) {
			return w.retryAt
		}
	}
	if w.st.State == runtime.StateRunning {
		if !w.running { // adopted, or started behind our back
			w.running = true
			w.bootDeadline = w.now().Add(readinessTimeout(d))
		}
		return w.watch(ctx, d)
	}
	if w.running { // created, stopped or crashed: it was running
		w.running = false
		w.exited(ctx, d)
	}
	if w.now().Before(w.retryAt) {
		return w.retryAt
	}
	return w.start(ctx, d)
}

// create reads the secrets and creates the instance; false when it failed
// (reported, retry scheduled).
func (w *worker) create(ctx context.Context, d api.DesiredInstance) bool {
	if w.cur.phase != api.InstanceFailed || w.cur.gen != d.Generation {
		w.set(ctx, d.Generation, api.InstancePending, "", "")
	}
	secrets, reason, err := w.readSecrets(ctx, d.Spec.Secrets)
	if err != nil {
		w.startFailed(ctx, d, reason, err)
		return false
	}
	st, err := w.r.rt.Create(ctx, ToRuntimeSpec(d, secrets))
	if err != nil {
		if ctx.Err() == nil {
			w.startFailed(ctx, d, runtime.ReasonOf(err, api.ReasonVMStartFailed), err)
		}
		return false
	}
	w.exists, w.st = true, st
	w.gen = d.Generation
	w.secrets = slices.Clone(d.Spec.Secrets)
	if w.secrets == nil {
		w.secrets = []string{}
	}
	return true
}

func (w *worker) readSecrets(ctx context.Context, names []string) (map[string][]byte, api.ReasonCode, error) {
	if len(names) == 0 {
		return nil, "", nil
	}
	if w.r.opts.Secrets == nil {
		return nil, api.ReasonSecretsMissing, fmt.Errorf("secrets %q: no secrets are available on this host", names)
	}
	out, err := w.r.opts.Secrets(ctx, w.id, names)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, api.ReasonSecretsMissing, fmt.Errorf("secrets: %w", err)
	}
	if err != nil {
		return nil, api.ReasonSecretsInjectionFailed, fmt.Errorf("secrets: %w", err)
	}
	for _, name := range names {
		if _, ok := out[name]; !ok {
			return nil, api.ReasonSecretsMissing, fmt.Errorf("secret %q: %w", name, fs.ErrNotExist)
		}
	}
	return out, "", nil
}

// start boots a created, stopped or crashed instance.
func (w *worker) start(ctx context.Context, d api.DesiredInstance) time.Time {
	st, err := w.r.rt.Start(ctx, w.id)
	if errors.Is(err, runtime.ErrSecretsNeeded) {
		st, err = w.resupply(ctx, d)
	}
	if err != nil {
		if ctx.Err() == nil {
			w.startFailed(ctx, d, runtime.ReasonOf(err, api.ReasonVMStartFailed), err)
		}
		return w.retryAt
	}
	now := w.now()
	if w.restartPending {
		w.restartPending = false
		w.restarts++
		w.restartTimes = append(w.restartTimes, now)
	}
	w.st, w.running, w.startFails = st, true, 0
	w.bootDeadline = now.Add(readinessTimeout(d))
	w.set(ctx, d.Generation, api.InstanceBooting, "", "")
	return w.bootDeadline
}

// resupply gives the runtime the instance's secrets again (it held them
// only in memory, and they went with an earlier agent: the QEMU runtime's
// in-memory seeds), read afresh through Options.Secrets, and starts it.
// Secrets whose values changed meanwhile make Create answer ErrExists:
// the instance is torn down, and the next pass creates it anew.
func (w *worker) resupply(ctx context.Context, d api.DesiredInstance) (runtime.Status, error) {
	w.log.Info("the runtime no longer holds the instance's secrets; reading them again")
	secrets, reason, err := w.readSecrets(ctx, d.Spec.Secrets)
	if err != nil {
		return runtime.Status{}, runtime.Errorf(reason, "start", w.id, "%w", err)
	}
	if _, err := w.r.rt.Create(ctx, ToRuntimeSpec(d, secrets)); err != nil {
		if errors.Is(err, runtime.ErrExists) {
			if terr := w.teardown(ctx, d); terr != nil {
				w.logErr(ctx, "recreate: tear down", terr)
			}
			return runtime.Status{}, runtime.Errorf(api.ReasonSecretsInjectionFailed, "start", w.id,
				"the secrets changed since the instance was created; recreating it: %w", err)
		}
		return runtime.Status{}, err
	}
	return w.r.rt.Start(ctx, w.id)
}

// watch checks a running instance: readiness while booting, health after.
func (w *worker) watch(ctx context.Context, d api.DesiredInstance) time.Time {
	now := w.now()
	if !w.st.Ready {
		if w.bootDeadline.IsZero() { // adopted before it was ready: the clock starts now
			w.bootDeadline = now.Add(readinessTimeout(d))
		}
		w.set(ctx, d.Generation, api.InstanceBooting, "", "")
		if now.Before(w.bootDeadline) {
			return w.bootDeadline
		}
		msg := fmt.Sprintf("not ready within %v", readinessTimeout(d))
		return w.restartAfter(ctx, d, api.ReasonHealthcheckFailed, msg)
	}
	if w.cur.phase != api.InstanceReady {
		w.probeFails = 0
		w.nextProbe = now.Add(healthInterval(d))
	}
	w.set(ctx, d.Generation, api.InstanceReady, "", "")
	hc := d.Spec.HealthCheck
	if hc == nil {
		return time.Time{}
	}
	if now.Before(w.nextProbe) {
		return w.nextProbe
	}
	pctx, cancel := context.WithTimeout(ctx, healthInterval(d))
	err := w.r.rt.Probe(pctx, w.id)
	cancel()
	w.nextProbe = w.now().Add(healthInterval(d))
	if err == nil {
		w.probeFails = 0
		return w.nextProbe
	}
	if ctx.Err() != nil {
		return time.Time{}
	}
	w.probeFails++
	threshold := hc.FailureThreshold
	if threshold <= 0 {
		threshold = DefaultFailureThreshold
	}
	w.log.Info("health check failed", "failures", w.probeFails, "threshold", threshold, "err", err)
	if w.probeFails < threshold {
		return w.nextProbe
	}
	msg := fmt.Sprintf("%d consecutive health checks failed: %v", w.probeFails, err)
	return w.restartAfter(ctx, d, api.ReasonHealthcheckFailed, msg)
}

// restartAfter stops an unhealthy instance and schedules its restart.
func (w *worker) restartAfter(ctx context.Context, d api.DesiredInstance, reason api.ReasonCode, msg string) time.Time {
	if _, err := w.r.rt.Stop(ctx, w.id, gracefulTimeout(d)); err != nil {
		w.logErr(ctx, "stop unhealthy instance", err)
		return time.Time{}
	}
	w.running = false
	if err := w.refresh(ctx); err != nil {
		w.logErr(ctx, "inspect", err)
	}
	w.scheduleRestart(ctx, d, reason, msg)
	return w.retryAt
}

// exited handles a process that ended while desired running.
func (w *worker) exited(ctx context.Context, d api.DesiredInstance) {
	msg := fmt.Sprintf("instance %s unexpectedly", w.st.State)
	if w.st.ExitDetail != "" {
		msg += ": " + w.st.ExitDetail
	}
	w.log.Warn("instance exited", "state", w.st.State, "reason", w.st.ExitReason, "detail", w.st.ExitDetail)
	w.scheduleRestart(ctx, d, w.st.ExitReason, msg)
}

// scheduleRestart reports Failed and sets the restart's backoff.
func (w *worker) scheduleRestart(ctx context.Context, d api.DesiredInstance, reason api.ReasonCode, msg string) {
	now := w.now()
	cutoff := now.Add(-w.r.opts.CrashLoopWindow)
	w.restartTimes = slices.DeleteFunc(w.restartTimes, func(t time.Time) bool { return t.Before(cutoff) })
	n := len(w.restartTimes)
	if n >= w.r.opts.CrashLoopThreshold {
		msg = fmt.Sprintf("%d restarts within %v; last: %s", n, w.r.opts.CrashLoopWindow, msg)
		reason = api.ReasonCrashLoopBackoff
	}
	delay := w.backoff(n)
	w.retryAt = now.Add(delay)
	w.restartPending = true
	w.set(ctx, d.Generation, api.InstanceFailed, reason, fmt.Sprintf("%s; restarting in %v", msg, delay))
}

// startFailed reports a failed create or start and schedules a retry.
func (w *worker) startFailed(ctx context.Context, d api.DesiredInstance, reason api.ReasonCode, err error) {
	delay := w.backoff(w.startFails)
	w.startFails++
	w.retryAt = w.now().Add(delay)
	w.log.Warn("instance failed to start", "reason", reason, "err", err, "retry_in", delay)
	w.set(ctx, d.Generation, api.InstanceFailed, reason, err.Error())
}

// backoff is BackoffBase·2^n, at most BackoffMax.
func (w *worker) backoff(n int) time.Duration {
	d := w.r.opts.BackoffBase
	for range n {
		if d >= w.r.opts.BackoffMax {
			break
		}
		d *= 2
	}
	return min(d, w.r.opts.BackoffMax)
}

// halt stops the instance without destroying it (desired stopped, or the
// host drains).
func (w *worker) halt(ctx context.Context, reason api.ReasonCode) {
	gen := w.d.Generation
	if w.exists && w.st.State == runtime.StateRunning {
		w.set(ctx, gen, api.InstanceDraining, reason, "")
		if !w.stop(ctx) {
			return
		}
	}
	w.running, w.restartPending, w.retryAt, w.startFails = false, false, time.Time{}, 0
	w.set(ctx, gen, api.InstanceStopped, reason, w.stopNote)
}

// remove stops and destroys the instance and reports it Stopped; true
// once it can be forgotten.
func (w *worker) remove(ctx context.Context, inSet bool) bool {
	gen := w.cur.gen
	if inSet {
		gen = w.d.Generation
	}
	if !inSet && !w.exists && w.cur.phase == "" {
		w.r.done(w.id, gen, inSet) // never existed, never reported
		return true
	}
	if w.exists {
		if w.st.State == runtime.StateRunning {
			w.set(ctx, gen, api.InstanceDraining, api.ReasonTerminatedByOperator, "")
			if !w.stop(ctx) {
				return false
			}
		}
		if err := w.r.rt.Destroy(ctx, w.id); err != nil {
			w.logErr(ctx, "destroy", err)
			return false
		}
		w.log.Info("instance destroyed")
		w.exists, w.st, w.running = false, runtime.Status{}, false
	}
	reported := w.set(ctx, gen, api.InstanceStopped, api.ReasonTerminatedByOperator, w.stopNote)
	if inSet && !reported {
		return false // the control plane waits for this report: retry it
	}
	w.r.done(w.id, gen, inSet)
	return true
}

// stop stops the instance gracefully and refreshes its status.
func (w *worker) stop(ctx context.Context) bool {
	res, err := w.r.rt.Stop(ctx, w.id, gracefulTimeout(w.d))
	if err != nil {
		w.logErr(ctx, "stop", err)
		return false
	}
	w.stopNote = fmt.Sprintf("stopped gracefully in %s", res.Took.Round(time.Millisecond))
	if res.HardStopped {
		w.log.Warn("guest did not shut down in time and was killed", "took", res.Took)
		w.stopNote = fmt.Sprintf("hard_stopped: the guest did not shut down within %s and was killed", gracefulTimeout(w.d))
	}
	w.running = false
	if err := w.refresh(ctx); err != nil {
		w.logErr(ctx, "inspect", err)
	}
	return true
}

// teardown stops and destroys the instance for a recreate and forgets its
// history.
func (w *worker) teardown(ctx context.Context, d api.DesiredInstance) error {
	if w.st.State == runtime.StateRunning {
		if _, err := w.r.rt.Stop(ctx, w.id, gracefulTimeout(d)); err != nil {
			return err
		}
	}
	if err := w.r.rt.Destroy(ctx, w.id); err != nil {
		return err
	}
	w.exists, w.st, w.running, w.gen, w.secrets = false, runtime.Status{}, false, 0, nil
	w.retryAt, w.startFails, w.restartPending = time.Time{}, 0, false
	w.restartTimes, w.restarts, w.probeFails = nil, 0, 0
	return nil
}

// specChanged reports whether the runtime instance differs from what d
// asks for: its runtime spec, or (when known) its secret names.
func (w *worker) specChanged(d api.DesiredInstance) bool {
	want, errW := json.Marshal(ToRuntimeSpec(d, nil))
	have, errH := json.Marshal(w.st.Spec)
	if errW != nil || errH != nil || string(want) != string(have) {
		return true
	}
	return w.secrets != nil && !slices.Equal(w.secrets, d.Spec.Secrets)
}

func (w *worker) logErr(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return // shutting down
	}
	w.log.Warn(what+" failed; retrying on the next pass", "err", err)
}

func readinessTimeout(d api.DesiredInstance) time.Duration {
	if t := time.Duration(d.Spec.Readiness.Timeout); t > 0 {
		return t
	}
	return DefaultReadinessTimeout
}

func healthInterval(d api.DesiredInstance) time.Duration {
	if hc := d.Spec.HealthCheck; hc != nil && hc.Interval > 0 {
		return time.Duration(hc.Interval)
	}
	return DefaultHealthInterval
}

func gracefulTimeout(d api.DesiredInstance) time.Duration {
	if t := time.Duration(d.Spec.GracefulTimeout); t > 0 {
		return t
	}
	return DefaultGracefulTimeout
}
