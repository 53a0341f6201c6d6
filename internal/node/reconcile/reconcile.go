// Package reconcile owns the node agent's instance reconciler: it
// converges the desired instances the control plane sends (SetDesired)
// against a runtime.Runtime, and reports each instance's status to the
// control plane only on transitions. It must not know any runtime adapter
// (it sees only the runtime port), must not talk HTTP itself (a Reporter
// does), and must never hold a lock across a runtime or Reporter call.
//
// Behaviour, per instance (each has its own goroutine, so one slow stop
// never holds up another; calls on one instance are one at a time):
//
//   - Desired running and absent: report Pending; read spec.Secrets through
//     Options.Secrets (missing → Failed secrets_missing; any other read
//     error → Failed secrets_injection_failed); Create (failure → Failed
//     with the error's reason, default vm_start_failed); Start (likewise);
//     report Booting. Ready when the runtime says so (EventReady or
//     Inspect().Ready) → report Ready. Not Ready within
//     spec.Readiness.Timeout (default 5m) → Failed healthcheck_failed, stop
//     and restart with backoff. A failed create or start is retried with
//     backoff (BackoffBase doubling up to BackoffMax) and stays Failed with
//     its reason meanwhile; Pending is not reported again.
//   - After Ready: with spec.HealthCheck set, Probe every Interval (default
//     10s); FailureThreshold (default 3) consecutive failures → Failed
//     healthcheck_failed, stop and restart with backoff. Without it, only
//     liveness (events and Inspect) is watched.
//   - Exited while desired running (crash, OOM, or the guest shut itself
//     down): Failed with the runtime's exit reason (oom_killed, or whatever
//     it gives, possibly none), then Start again after BackoffBase·2^n, n
//     being the restarts within CrashLoopWindow, at most BackoffMax, for
//     ever (kubelet's CrashLoopBackOff). Once n ≥ CrashLoopThreshold the
//     reason while waiting is crash_loop_backoff. Readiness and health
//     failures count as restarts too. Restarts older than the window drop
//     out; Ready resets nothing.
//   - Desired stopped: Draining (terminated_by_operator) → Stop
//     (spec.GracefulTimeout, default 30s) → Stopped (terminated_by_operator).
//   - Desired deleted, or an instance with Owner "reconciler" that is absent
//     from the desired set: Draining → Stop → Destroy → Stopped
//     (terminated_by_operator); then the instance is forgotten (a deleted
//     one once that report succeeded).
//   - Host draining: every instance Draining (node_draining) → Stop →
//     Stopped (node_draining), not destroyed; it starts again when draining
//     ends and it is desired running.
//   - Generation changed: when the runtime spec (ToRuntimeSpec, compared in
//     its persisted JSON form) or the secret names differ, Stop, Destroy,
//     Create, Start again, reporting Pending, Booting, Ready; otherwise the
//     running instance is kept and its status reported with the new
//     generation.
//   - Reports: a status is sent only when (phase, reason_code) or the
//     generation differ from the last successful report. A failed report
//     is retried on the next pass with the latest status (intermediate ones
//     are not replayed). Reports carry runtime info from Inspect.
//   - Run calls Recover once and adopts instances with Owner "reconciler"
//     without creating or starting them again. Until the first SetDesired
//     nothing is created, stopped or destroyed (an agent that restarts must
//     not destroy instances before it knows what is wanted).
//
// A pass runs on SetDesired, on a runtime event for the instance, at the
// instance's own deadlines (backoff, readiness, next probe) and every
// Interval.
package reconcile

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Owner is the runtime.Spec owner of instances the reconciler manages.
const Owner = "reconciler"

// Defaults.
const (
	DefaultInterval           = 5 * time.Second
	DefaultBackoffBase        = time.Second
	DefaultBackoffMax         = 5 * time.Minute
	DefaultCrashLoopThreshold = 5
	DefaultCrashLoopWindow    = 10 * time.Minute
	DefaultReadinessTimeout   = 5 * time.Minute
	DefaultHealthInterval     = 10 * time.Second
	DefaultFailureThreshold   = 3
	DefaultGracefulTimeout    = 30 * time.Second
)

// Reporter sends one status transition of an instance to the control plane.
type Reporter interface {
	ReportStatus(ctx context.Context, instanceID string, r api.InstanceStatusReport) error
}

// Options configures a Reconciler; zero fields take the defaults above.
type Options struct {
	Interval           time.Duration // resync tick (default 5s)
	BackoffBase        time.Duration // restart backoff base (default 1s), doubles per restart
	BackoffMax         time.Duration // default 5m
	CrashLoopThreshold int           // restarts within CrashLoopWindow that make it crash_loop_backoff (default 5)
	CrashLoopWindow    time.Duration // default 10m
	// Secrets reads the secrets instance instanceID names, all at once,
	// right before its Create: the values are held in memory for that call
	// only. Nil: no secrets are available. An error wrapping
	// fs.ErrNotExist means missing (secrets_missing); any other error is
	// secrets_injection_failed; a name absent from the answer is missing.
	Secrets func(ctx context.Context, instanceID string, names []string) (map[string][]byte, error)
	Log     *slog.Logger
	// Now is the clock for deadlines (backoff, readiness, probes) and
	// report times. Waits are real timers computed from it, so a test clock
	// must advance for deadlines to pass.
	Now func() time.Time
}

// Observed is one instance as the reconciler sees it now, for the local API
// and capacity accounting.
type Observed struct {
	ID         string
	Name       string
	Generation int64
	Phase      api.InstancePhase
	Reason     api.ReasonCode
	Message    string
	Resources  api.Capacity
	Runtime    api.InstanceRuntime
}

// Reconciler converges desired instances against a runtime. Create it with
// New, feed it with SetDesired, and call Run once.
type Reconciler struct {
	rt   runtime.Runtime
	rep  Reporter
	opts Options
	log  *slog.Logger

	wake chan struct{} // capacity 1: the desired set changed

	mu          sync.Mutex
	desired     map[string]api.DesiredInstance
	haveDesired bool // SetDesired was called at least once
	draining    bool
	tombstones  map[string]bool // deleted instances already destroyed and reported
	observed    map[string]observedEntry
}

type observedEntry struct {
	obs   Observed
	holds bool // holds capacity
}

// New returns a Reconciler over rt that reports through rep.
func New(rt runtime.Runtime, rep Reporter, opts Options) *Reconciler {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.BackoffBase <= 0 {
		opts.BackoffBase = DefaultBackoffBase
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	opts.BackoffMax = max(opts.BackoffMax, opts.BackoffBase)
	if opts.CrashLoopThreshold <= 0 {
		opts.CrashLoopThreshold = DefaultCrashLoopThreshold
	}
	if opts.CrashLoopWindow <= 0 {
		opts.CrashLoopWindow = DefaultCrashLoopWindow
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Reconciler{
		rt:         rt,
		rep:        rep,
		opts:       opts,
		log:        opts.Log.With("component", "reconcile"),
		wake:       make(chan struct{}, 1),
		desired:    map[string]api.DesiredInstance{},
		tombstones: map[string]bool{},
		observed:   map[string]observedEntry{},
	}
}

// SetDesired replaces the desired set and triggers a pass; it does not
// block. draining says the host is being drained. Of duplicate ids the
// last wins.
func (r *Reconciler) SetDesired(set []api.DesiredInstance, draining bool) {
	m := make(map[string]api.DesiredInstance, len(set))
	for _, d := range set {
		m[d.ID] = d
	}
	r.mu.Lock()
	r.desired = m
	r.haveDesired = true
	r.draining = draining
	for id := range r.tombstones {
		if d, ok := m[id]; !ok || d.DesiredState != api.DesiredDeleted {
			delete(r.tombstones, id)
		}
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run recovers the runtime's instances once (adopting those with Owner
// "reconciler"), then reconciles until ctx ends, and returns ctx.Err()
// once every per-instance goroutine has ended. Instances keep running when
// it returns (an agent restart adopts them). Call it once.
func (r *Reconciler) Run(ctx context.Context) error {
	recovered, err := r.rt.Recover(ctx)
	if err != nil {
		// Create is idempotent per id, so instances found later by Inspect
		// are adopted rather than duplicated.
		r.log.Warn("recover failed; instances are adopted as found", "err", err)
	}
	events := r.rt.Subscribe(ctx)

	var wg sync.WaitGroup
	workers := map[string]*worker{}
	finished := make(chan *worker)
	spawn := func(id string, adopted *runtime.Status) {
		w := newWorker(r, id, adopted)
		workers[id] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w.run(ctx) {
				select {
				case finished <- w:
				case <-ctx.Done():
				}
			}
		}()
	}
	for i := range recovered {
		st := recovered[i]
		if st.Owner != Owner {
			continue
		}
		r.log.Info("adopting instance", "instance", st.ID, "state", st.State, "ready", st.Ready)
		spawn(st.ID, &st)
	}
	sync := func() {
		for _, id := range r.wantedIDs() {
			if workers[id] == nil {
				spawn(id, nil)
			}
		}
		for _, w := range workers {
			w.poke()
		}
	}
	sync()

	tick := time.NewTicker(r.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		case <-r.wake:
			sync()
		case <-tick.C:
			sync()
		case ev, ok := <-events:
			if !ok {
				events = nil // the runtime ended the subscription; ticks still resync
				continue
			}
			if w := workers[ev.ID]; w != nil {
				w.poke()
			}
		case w := <-finished:
			if workers[w.id] == w {
				delete(workers, w.id)
			}
			sync()
		}
	}
}

// wantedIDs lists desired ids that need a worker: all but deleted ones
// already done with.
func (r *Reconciler) wantedIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.desired))
	for id, d := range r.desired {
		if d.DesiredState == api.DesiredDeleted && r.tombstones[id] {
			continue
		}
		ids = append(ids, id)
	}
	return ids
}

// desiredOf returns id's desired record, whether it is in the set, whether
// the host drains, and whether any desired set arrived yet.
func (r *Reconciler) desiredOf(id string) (d api.DesiredInstance, inSet, draining, have bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, inSet = r.desired[id]
	return d, inSet, r.draining, r.haveDesired
}

// done records that a deleted instance was destroyed and reported, unless
// the desired set changed meanwhile; it forgets its observed status.
func (r *Reconciler) done(id string, gen int64, inSet bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.desired[id]; inSet && ok && d.DesiredState == api.DesiredDeleted && d.Generation == gen {
		r.tombstones[id] = true
	}
	delete(r.observed, id)
}

func (r *Reconciler) publish(id string, e observedEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observed[id] = e
}

// Instances returns a snapshot of every instance the reconciler tracks,
// sorted by ID.
func (r *Reconciler) Instances() []Observed {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Observed, 0, len(r.observed))
	for _, e := range r.observed {
		out = append(out, e.obs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Desired is instance id's entry in the desired set, if it has one.
func (r *Reconciler) Desired(id string) (api.DesiredInstance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.desired[id]
	return d, ok
}

// Allocated sums the resources of instances that hold capacity: desired
// running and not Stopped (Failed ones waiting to restart included).
func (r *Reconciler) Allocated() api.Capacity {
	r.mu.Lock()
	defer r.mu.Unlock()
	var c api.Capacity
	for _, e := range r.observed {
		if e.holds {
			c.VCPUs += e.obs.Resources.VCPUs
			c.MemoryMiB += e.obs.Resources.MemoryMiB
			c.DiskGiB += e.obs.Resources.DiskGiB
			c.GPUs += e.obs.Resources.GPUs
		}
	}
	return c
}

// ToRuntimeSpec converts a desired instance (the wire's VM-shaped
// api.InstanceSpec, which does not change) to the runtime's spec: ID is
// the instance id, Owner "reconciler"; the image is a disk image, the
// network's forwards become Ports and its mode, bridge and MAC the VM
// section, with the direct boot and cloud-init. GPUs and Slots are not
// mapped here: passing devices through is the agent's business.
func ToRuntimeSpec(d api.DesiredInstance, secrets map[string][]byte) runtime.Spec {
	s := d.Spec
	if s.Runtime == api.RuntimeDocker && s.Container != nil {
		return containerSpec(d, secrets)
	}
	if s.Runtime == api.RuntimeMicroVM {
		return microVMSpec(d, secrets)
	}
	return runtime.Spec{
		ID:        d.ID,
		Owner:     Owner,
		Image:     runtime.DiskImage(s.Image),
		Ports:     s.Network.Forwards,
		Resources: runtime.Resources{VCPUs: s.VCPUs, MemoryMiB: s.MemoryMiB, DiskGiB: s.DiskGiB},
		Readiness: runtime.Readiness{Readiness: s.Readiness, HealthCheck: s.HealthCheck},
		Secrets:   secrets,
		// The approved slots' GPUs and fabric VFs, resolved by the control
		// plane.
		Devices: runtime.Devices{PCI: d.PCIDevices},
		VM: &runtime.VMSpec{
			Boot:      s.Boot,
			Network:   runtime.VMNetwork{Mode: s.Network.Mode, Bridge: s.Network.Bridge, MAC: s.Network.MAC},
			CloudInit: s.CloudInit,
		},
	}
}

// containerSpec is ToRuntimeSpec for a container (spec.runtime "docker"):
// an OCI image, no VM section.
func containerSpec(d api.DesiredInstance, secrets map[string][]byte) runtime.Spec {
	s, c := d.Spec, d.Spec.Container
	var vols []runtime.Volume
	for _, v := range c.Volumes {
		vols = append(vols, runtime.Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly, SizeGiB: v.SizeGiB, Format: v.Format})
	}
	var cs *runtime.ContainerSpec
	if u := c.Ulimits; u != nil || c.RegistryAuth != "" || c.ShmSizeMiB > 0 {
		cs = &runtime.ContainerSpec{RegistryAuth: c.RegistryAuth, ShmSizeMiB: c.ShmSizeMiB}
		if u != nil && (u.NoFile > 0 || u.NProc > 0) {
			cs.Ulimits = map[string]int64{}
			if u.NoFile > 0 {
				cs.Ulimits["nofile"] = u.NoFile
			}
			if u.NProc > 0 {
				cs.Ulimits["nproc"] = u.NProc
			}
		}
	}
	return runtime.Spec{
		ID:        d.ID,
		Owner:     Owner,
		Image:     runtime.Image{Kind: runtime.ImageOCI, Ref: c.Image, Digest: c.Digest},
		Command:   c.Command,
		Args:      c.Args,
		Env:       c.Env,
		Ports:     s.Network.Forwards,
		Volumes:   vols,
		Devices:   runtime.Devices{GPUs: c.GPUs},
		Resources: runtime.Resources{VCPUs: s.VCPUs, MemoryMiB: s.MemoryMiB},
		Readiness: runtime.Readiness{Readiness: s.Readiness, HealthCheck: s.HealthCheck},
		Secrets:   secrets,
		Container: cs,
	}
}

// runtimeName names the runtime that runs spec: behind a runtime.Router
// the one it routes spec to ("docker"), else the runtime's own name.
func runtimeName(rt runtime.Runtime, spec runtime.Spec) string {
	if r, ok := rt.(runtime.Dispatcher); ok {
		return r.For(spec).Name()
	}
	return rt.Name()
}
