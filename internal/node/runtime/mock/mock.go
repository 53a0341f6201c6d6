// Package mock owns an in-memory runtime.Runtime for tests and for agents
// run without a hypervisor: instances are records in a map, "booting" is a
// timer, and tests inject failures (Behavior), crashes (Crash) and guest
// shutdowns (GuestShutdown), then check which calls were made (Calls). It
// keeps the semantics documented on runtime.Runtime (idempotent Create with
// the same spec, ErrExists with another, no-op Start and Stop, idempotent
// Destroy, ErrNotFound from Inspect, best-effort per-subscriber events). It
// must not start processes, touch the filesystem or the network.
package mock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// DefaultReadyAfter is how long after Start an instance becomes Ready when
// its Behavior does not say.
const DefaultReadyAfter = 10 * time.Millisecond

// subscriberBuffer is each subscriber's channel capacity; events beyond it
// are dropped for that subscriber (delivery is best-effort).
const subscriberBuffer = 64

// Behavior injects failures for one instance (SetBehavior) or for every
// instance without its own (SetDefaultBehavior). The zero Behavior is a
// healthy instance that becomes Ready DefaultReadyAfter after Start.
type Behavior struct {
	// CreateErr makes Create fail with a *runtime.Error carrying it.
	CreateErr api.ReasonCode
	// StartErr makes Start fail with a *runtime.Error carrying it.
	StartErr api.ReasonCode
	// NeverReady keeps a started instance from ever becoming Ready.
	NeverReady bool
	// ReadyAfter is the delay from Start to Ready (0: DefaultReadyAfter).
	ReadyAfter time.Duration
	// ProbeErr is returned by Probe while set (read at each Probe).
	ProbeErr error
	// IgnoreStop makes the guest ignore a graceful stop: Stop waits the
	// graceful timeout, kills it and reports HardStopped.
	IgnoreStop bool
}

// Options configures a Runtime.
type Options struct {
	Now func() time.Time // default time.Now
	Log *slog.Logger     // default slog.Default()
}

// Call is one runtime.Runtime method call, recorded in order. Op is the
// lower-case method name ("create", "start", "stop", "destroy", "inspect",
// "list", "recover", "probe", "subscribe"); ID is empty for calls without
// one.
type Call struct {
	Op string
	ID string
	At time.Time
}

// Runtime is the in-memory runtime. Handles made by Reopen share its state.
type Runtime struct {
	h *host
}

var _ runtime.Runtime = (*Runtime)(nil)

// host is the state a real runtime would keep on disk and in its processes:
// it outlives a Runtime handle (see Reopen).
type host struct {
	now func() time.Time
	log *slog.Logger

	mu        sync.Mutex
	insts     map[string]*instance
	idLocks   map[string]*sync.Mutex // serialise calls on one id
	behaviors map[string]Behavior
	def       Behavior
	calls     []Call
	subs      map[*subscriber]struct{}
	nextPID   int
	nextPort  int
	logs      logBook // each instance's log lines (logs.go)
}

type instance struct {
	st    runtime.Status
	epoch int         // bumped at every start and exit; stale timers check it
	ready *time.Timer // pending readiness, nil when none
}

type subscriber struct {
	ch chan runtime.Event
}

// New returns an empty in-memory runtime.
func New(opts Options) *Runtime {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &Runtime{h: &host{
		now:       opts.Now,
		log:       opts.Log.With("runtime", "mock"),
		insts:     map[string]*instance{},
		idLocks:   map[string]*sync.Mutex{},
		behaviors: map[string]Behavior{},
		subs:      map[*subscriber]struct{}{},
		nextPID:   1000,
		nextPort:  20000,
	}}
}

// Reopen returns a new handle over the same instances, behaviors and call
// log, as an agent restarted over the same state directory would see them
// (running instances keep running; Recover marks them Adopted).
func (m *Runtime) Reopen() *Runtime { return &Runtime{h: m.h} }

// Name implements runtime.Runtime.
func (m *Runtime) Name() string { return Name }

// SetBehavior sets the behavior of one instance id, also before it exists.
func (m *Runtime) SetBehavior(id string, b Behavior) {
	m.h.mu.Lock()
	defer m.h.mu.Unlock()
	m.h.behaviors[id] = b
}

// SetDefaultBehavior sets the behavior of ids without their own.
func (m *Runtime) SetDefaultBehavior(b Behavior) {
	m.h.mu.Lock()
	defer m.h.mu.Unlock()
	m.h.def = b
}

// Crash makes a running instance's process exit unexpectedly: its state
// becomes crashed with ExitReason reason ("" allowed) and an EventExited is
// emitted. Crashing an instance that does not run does nothing.
func (m *Runtime) Crash(id string, reason api.ReasonCode) {
	m.exit(id, runtime.StateCrashed, reason, "crashed (injected)")
}

// GuestShutdown makes a running instance's guest power itself off: its
// state becomes stopped without anyone asking, and an EventExited is
// emitted.
func (m *Runtime) GuestShutdown(id string) {
	m.exit(id, runtime.StateStopped, "", "guest shut down")
}

func (m *Runtime) exit(id string, state runtime.State, reason api.ReasonCode, detail string) {
	h := m.h
	h.mu.Lock()
	defer h.mu.Unlock()
	in, ok := h.insts[id]
	if !ok || in.st.State != runtime.StateRunning {
		return
	}
	h.markExitedLocked(in, state, reason, detail)
}

// Calls returns every runtime.Runtime method call so far, in order.
func (m *Runtime) Calls() []Call {
	m.h.mu.Lock()
	defer m.h.mu.Unlock()
	return slices.Clone(m.h.calls)
}

// CallCount counts the calls of op on id ("" id counts every id).
func (m *Runtime) CallCount(op, id string) int {
	n := 0
	for _, c := range m.Calls() {
		if c.Op == op && (id == "" || c.ID == id) {
			n++
		}
	}
	return n
}

// Running returns the ids of running instances, sorted.
func (m *Runtime) Running() []string {
	m.h.mu.Lock()
	defer m.h.mu.Unlock()
	var ids []string
	for id, in := range m.h.insts {
		if in.st.State == runtime.StateRunning {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// Create implements runtime.Runtime.
func (m *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	h := m.h
	h.record("create", spec.ID)
	if err := ctx.Err(); err != nil {
		return runtime.Status{}, err
	}
	if !runtime.ValidID(spec.ID) {
		return runtime.Status{}, runtime.Errorf(api.ReasonVMStartFailed, "create", spec.ID, "invalid instance id %q", spec.ID)
	}
	unlock := h.lockID(spec.ID)
	defer unlock()

	stored, err := cloneSpec(spec)
	if err != nil {
		return runtime.Status{}, runtime.Errorf(api.ReasonVMStartFailed, "create", spec.ID, "encode spec: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if in, ok := h.insts[spec.ID]; ok {
		if !sameSpec(in.st.Spec, stored) {
			return runtime.Status{}, &runtime.Error{Reason: api.ReasonVMStartFailed, Op: "create", ID: spec.ID, Err: runtime.ErrExists}
		}
		return copyStatus(in.st), nil
	}
	if code := h.behaviorLocked(spec.ID).CreateErr; code != "" {
		return runtime.Status{}, runtime.Errorf(code, "create", spec.ID, "injected create failure")
	}
	accel := spec.VMOrZero().Accel
	if accel == "" {
		accel = "mock"
	}
	in := &instance{st: runtime.Status{
		ID:    spec.ID,
		Owner: spec.Owner,
		State: runtime.StateCreated,
		Accel: accel,
		Spec:  stored,
	}}
	if len(spec.Ports) > 0 {
		in.st.Ports = map[string]int{}
		for _, f := range spec.Ports {
			port := f.HostPort
			if port == 0 {
				port = h.nextPort
				h.nextPort++
			}
			in.st.Ports[f.Name] = port
		}
	}
	h.insts[spec.ID] = in
	h.log.Debug("created", "id", spec.ID)
	return copyStatus(in.st), nil
}

// Start implements runtime.Runtime.
func (m *Runtime) Start(ctx context.Context, id string) (runtime.Status, error) {
	h := m.h
	h.record("start", id)
	if err := ctx.Err(); err != nil {
		return runtime.Status{}, err
	}
	unlock := h.lockID(id)
	defer unlock()

	h.mu.Lock()
	defer h.mu.Unlock()
	in, ok := h.insts[id]
	if !ok {
		return runtime.Status{}, notFound("start", id)
	}
	if in.st.State == runtime.StateRunning {
		return copyStatus(in.st), nil
	}
	b := h.behaviorLocked(id)
	if b.StartErr != "" {
		return runtime.Status{}, runtime.Errorf(b.StartErr, "start", id, "injected start failure")
	}
	now := h.now()
	in.epoch++
	in.st.State = runtime.StateRunning
	in.st.Ready = false
	in.st.Adopted = false
	in.st.PID = h.nextPID
	h.nextPID++
	in.st.StartedAt = now
	in.st.ExitedAt = time.Time{}
	in.st.ExitReason = ""
	in.st.ExitDetail = ""
	h.emitLocked(runtime.Event{ID: id, Kind: runtime.EventStarted, At: now})
	if !b.NeverReady {
		after := b.ReadyAfter
		if after <= 0 {
			after = DefaultReadyAfter
		}
		epoch := in.epoch
		in.ready = time.AfterFunc(after, func() { h.becomeReady(id, epoch) })
	}
	h.log.Debug("started", "id", id, "pid", in.st.PID)
	return copyStatus(in.st), nil
}

// becomeReady marks an instance Ready unless it exited or restarted since.
func (h *host) becomeReady(id string, epoch int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	in, ok := h.insts[id]
	if !ok || in.epoch != epoch || in.st.State != runtime.StateRunning {
		return
	}
	in.ready = nil
	in.st.Ready = true
	h.emitLocked(runtime.Event{ID: id, Kind: runtime.EventReady, At: h.now()})
}

// Stop implements runtime.Runtime.
func (m *Runtime) Stop(ctx context.Context, id string, graceful time.Duration) (runtime.StopResult, error) {
	h := m.h
	h.record("stop", id)
	unlock := h.lockID(id)
	defer unlock()

	h.mu.Lock()
	in, ok := h.insts[id]
	if !ok {
		h.mu.Unlock()
		return runtime.StopResult{}, notFound("stop", id)
	}
	if in.st.State != runtime.StateRunning {
		h.mu.Unlock()
		return runtime.StopResult{}, nil
	}
	ignore := h.behaviorLocked(id).IgnoreStop
	epoch := in.epoch
	start := h.now()
	h.mu.Unlock()

	var ctxErr error
	if ignore {
		// The guest ignores the request: wait out the graceful timeout,
		// then kill it (also when ctx ends first, as a real runtime would
		// not leave a half-stopped VM behind).
		t := time.NewTimer(graceful)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			ctxErr = ctx.Err()
		}
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	res := runtime.StopResult{HardStopped: ignore}
	if in, ok := h.insts[id]; ok && in.epoch == epoch && in.st.State == runtime.StateRunning {
		detail := "stopped"
		if ignore {
			detail = "killed after graceful timeout"
		}
		h.markExitedLocked(in, runtime.StateStopped, "", detail)
	}
	res.Took = h.now().Sub(start)
	if ctxErr != nil {
		return res, fmt.Errorf("stop %s: %w", id, ctxErr)
	}
	return res, nil
}

// Destroy implements runtime.Runtime.
func (m *Runtime) Destroy(ctx context.Context, id string) error {
	h := m.h
	h.record("destroy", id)
	unlock := h.lockID(id)
	defer unlock()

	h.mu.Lock()
	defer h.mu.Unlock()
	in, ok := h.insts[id]
	if !ok {
		return nil
	}
	if in.st.State == runtime.StateRunning {
		h.markExitedLocked(in, runtime.StateStopped, "", "destroyed")
	}
	delete(h.insts, id)
	h.log.Debug("destroyed", "id", id)
	return nil
}

// Inspect implements runtime.Runtime.
func (m *Runtime) Inspect(ctx context.Context, id string) (runtime.Status, error) {
	h := m.h
	h.record("inspect", id)
	h.mu.Lock()
	defer h.mu.Unlock()
	in, ok := h.insts[id]
	if !ok {
		return runtime.Status{}, notFound("inspect", id)
	}
	return copyStatus(in.st), nil
}

// List implements runtime.Runtime.
func (m *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	h := m.h
	h.record("list", "")
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.allLocked(), nil
}

// Recover implements runtime.Runtime: it returns every instance it holds,
// marking running ones Adopted.
func (m *Runtime) Recover(ctx context.Context) ([]runtime.Status, error) {
	h := m.h
	h.record("recover", "")
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, in := range h.insts {
		if in.st.State == runtime.StateRunning {
			in.st.Adopted = true
		}
	}
	return h.allLocked(), nil
}

// Probe implements runtime.Runtime.
func (m *Runtime) Probe(ctx context.Context, id string) error {
	h := m.h
	h.record("probe", id)
	h.mu.Lock()
	defer h.mu.Unlock()
	in, ok := h.insts[id]
	if !ok {
		return notFound("probe", id)
	}
	if in.st.State != runtime.StateRunning {
		return fmt.Errorf("probe %s: instance is %s", id, in.st.State)
	}
	if err := h.behaviorLocked(id).ProbeErr; err != nil {
		return fmt.Errorf("probe %s: %w", id, err)
	}
	return nil
}

// Subscribe implements runtime.Runtime: each subscriber has its own
// buffered channel; events that do not fit are dropped for it.
func (m *Runtime) Subscribe(ctx context.Context) <-chan runtime.Event {
	h := m.h
	h.record("subscribe", "")
	s := &subscriber{ch: make(chan runtime.Event, subscriberBuffer)}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, s)
		close(s.ch)
	})
	return s.ch
}

func (h *host) record(op, id string) {
	at := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, Call{Op: op, ID: id, At: at})
}

// lockID serialises calls on one id and returns the unlock function.
func (h *host) lockID(id string) func() {
	h.mu.Lock()
	l, ok := h.idLocks[id]
	if !ok {
		l = &sync.Mutex{}
		h.idLocks[id] = l
	}
	h.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (h *host) behaviorLocked(id string) Behavior {
	if b, ok := h.behaviors[id]; ok {
		return b
	}
	return h.def
}

func (h *host) markExitedLocked(in *instance, state runtime.State, reason api.ReasonCode, detail string) {
	if in.ready != nil {
		in.ready.Stop()
		in.ready = nil
	}
	now := h.now()
	in.epoch++
	in.st.State = state
	in.st.Ready = false
	in.st.Adopted = false
	in.st.PID = 0
	in.st.ExitedAt = now
	in.st.ExitReason = reason
	in.st.ExitDetail = detail
	h.emitLocked(runtime.Event{ID: in.st.ID, Kind: runtime.EventExited, At: now, State: state, Reason: reason, Detail: detail})
	h.log.Debug("exited", "id", in.st.ID, "state", state, "reason", reason)
}

// emitLocked delivers ev to every subscriber that has room.
func (h *host) emitLocked(ev runtime.Event) {
	for s := range h.subs {
		select {
		case s.ch <- ev:
		default:
			h.log.Debug("event dropped for a slow subscriber", "id", ev.ID, "kind", ev.Kind)
		}
	}
}

func (h *host) allLocked() []runtime.Status {
	out := make([]runtime.Status, 0, len(h.insts))
	for _, in := range h.insts {
		out = append(out, copyStatus(in.st))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func notFound(op, id string) error {
	return fmt.Errorf("%s %s: %w", op, id, runtime.ErrNotFound)
}

// cloneSpec deep-copies a spec the way a real runtime persists it: through
// its JSON form, which leaves out Secrets.
func cloneSpec(s runtime.Spec) (runtime.Spec, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return runtime.Spec{}, err
	}
	var out runtime.Spec
	if err := json.Unmarshal(b, &out); err != nil {
		return runtime.Spec{}, err
	}
	return out, nil
}

// sameSpec compares specs by their persisted (JSON) form.
func sameSpec(a, b runtime.Spec) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errors.Join(errA, errB) == nil && string(ja) == string(jb)
}

func copyStatus(st runtime.Status) runtime.Status {
	out := st
	out.Ports = maps.Clone(st.Ports)
	if spec, err := cloneSpec(st.Spec); err == nil {
		out.Spec = spec
	}
	return out
}
