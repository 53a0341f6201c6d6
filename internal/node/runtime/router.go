package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// What a runtime may say about itself, for the agent's capabilities.
type (
	// Multi is a runtime made of several (a Router): Names are theirs.
	Multi interface {
		Names() []string
	}
	// Dispatcher is a runtime that hands each spec to another (a Router):
	// For is the one that runs spec.
	Dispatcher interface {
		For(spec Spec) Runtime
	}
	// EngineReporter is a runtime backed by a container engine: its name
	// ("docker", "podman") and version, as detected at start.
	EngineReporter interface {
		ContainerEngine() (name, version string)
	}
)

// Router runs VMs on one runtime and containers on another behind the one
// Runtime the reconciler and the slice provisioner drive
// (docs/adr/0008-container-runtime.md): Create goes by the spec's image
// kind (an OCI image to the container runtime, anything else to the VM
// runtime); calls by id go to the runtime that has the id; List, Recover
// and Subscribe merge both. Instance ids are the control plane's, unique
// across both.
type Router struct {
	vm, ct Runtime

	mu    sync.Mutex
	where map[string]Runtime // id → the runtime that created or recovered it
}

var (
	_ Runtime        = (*Router)(nil)
	_ Releaser       = (*Router)(nil)
	_ OrphanSweeper  = (*Router)(nil)
	_ Multi          = (*Router)(nil)
	_ Dispatcher     = (*Router)(nil)
	_ EngineReporter = (*Router)(nil)
	_ LogReader      = (*Router)(nil)
)

// ErrLogsUnsupported is wrapped by the error of Logs on a Router whose
// runtime holding the instance has no LogReader (the agent answers
// logs.open with logs_unsupported, as for a runtime without one).
var ErrLogsUnsupported = errors.New("the runtime cannot read logs")

// NewRouter routes between a VM runtime and a container runtime.
func NewRouter(vm, containers Runtime) *Router {
	return &Router{vm: vm, ct: containers, where: map[string]Runtime{}}
}

// Name is both runtimes' names ("qemu+docker").
func (r *Router) Name() string { return r.vm.Name() + "+" + r.ct.Name() }

// Names are the routed runtimes' names, VM runtime first (its own Names
// when it has several: qemu and microvm).
func (r *Router) Names() []string {
	var out []string
	for _, rt := range []Runtime{r.vm, r.ct} {
		if m, ok := rt.(Multi); ok {
			out = append(out, m.Names()...)
		} else {
			out = append(out, rt.Name())
		}
	}
	return out
}

// ContainerEngine is the container runtime's engine, when it reports one.
func (r *Router) ContainerEngine() (string, string) {
	if e, ok := r.ct.(EngineReporter); ok {
		return e.ContainerEngine()
	}
	return "", ""
}

// For returns the runtime that runs spec.
func (r *Router) For(spec Spec) Runtime {
	if spec.Image.IsOCI() && !spec.VMOrZero().MicroVM {
		return r.ct
	}
	return r.vm
}

func (r *Router) remember(id string, rt Runtime) {
	r.mu.Lock()
	r.where[id] = rt
	r.mu.Unlock()
}

// find is the runtime that has id: the one remembered, else the first
// that knows it; nil when neither does.
func (r *Router) find(ctx context.Context, id string) (Runtime, error) {
	r.mu.Lock()
	rt := r.where[id]
	r.mu.Unlock()
	if rt != nil {
		return rt, nil
	}
	for _, rt := range []Runtime{r.vm, r.ct} {
		_, err := rt.Inspect(ctx, id)
		if err == nil {
			r.remember(id, rt)
			return rt, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}
	return nil, nil
}

// notFound is the error of an id neither runtime has.
func notFound(op, id string) error {
	return &Error{Op: op, ID: id, Err: fmt.Errorf("%w (in neither runtime)", ErrNotFound)}
}

// Create creates spec on the runtime for its kind.
func (r *Router) Create(ctx context.Context, spec Spec) (Status, error) {
	rt := r.For(spec)
	if other, err := r.find(ctx, spec.ID); err == nil && other != nil && other != rt {
		return Status{}, &Error{Op: "create", ID: spec.ID, Err: fmt.Errorf("%w: it runs on %s", ErrExists, other.Name())}
	}
	st, err := rt.Create(ctx, spec)
	if err == nil {
		r.remember(spec.ID, rt)
	}
	return st, err
}

// Start starts id on its runtime.
func (r *Router) Start(ctx context.Context, id string) (Status, error) {
	rt, err := r.find(ctx, id)
	if err != nil || rt == nil {
		return Status{}, errors.Join(err, notFound("start", id))
	}
	return rt.Start(ctx, id)
}

// Stop stops id on its runtime.
func (r *Router) Stop(ctx context.Context, id string, graceful time.Duration) (StopResult, error) {
	rt, err := r.find(ctx, id)
	if err != nil || rt == nil {
		return StopResult{}, errors.Join(err, notFound("stop", id))
	}
	return rt.Stop(ctx, id, graceful)
}

// Destroy destroys id on its runtime; an unknown id is a no-op.
func (r *Router) Destroy(ctx context.Context, id string) error {
	rt, err := r.find(ctx, id)
	if err != nil || rt == nil {
		return err
	}
	if err := rt.Destroy(ctx, id); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.where, id)
	r.mu.Unlock()
	return nil
}

// Inspect inspects id on its runtime.
func (r *Router) Inspect(ctx context.Context, id string) (Status, error) {
	rt, err := r.find(ctx, id)
	if err != nil || rt == nil {
		return Status{}, errors.Join(err, notFound("inspect", id))
	}
	return rt.Inspect(ctx, id)
}

// Probe probes id on its runtime.
func (r *Router) Probe(ctx context.Context, id string) error {
	rt, err := r.find(ctx, id)
	if err != nil || rt == nil {
		return errors.Join(err, notFound("probe", id))
	}
	return rt.Probe(ctx, id)
}

// Logs reads id's log from its runtime when that runtime is a LogReader;
// otherwise the error wraps ErrLogsUnsupported. An id neither runtime has
// wraps ErrNotFound.
func (r *Router) Logs(ctx context.Context, id string, opts LogOptions) (io.ReadCloser, error) {
	rt, err := r.find(ctx, id)
	if err != nil || rt == nil {
		return nil, errors.Join(err, notFound("logs", id))
	}
	lr, ok := rt.(LogReader)
	if !ok {
		return nil, fmt.Errorf("logs %s: runtime %s: %w", id, rt.Name(), ErrLogsUnsupported)
	}
	return lr.Logs(ctx, id, opts)
}

// List lists both runtimes' instances.
func (r *Router) List(ctx context.Context) ([]Status, error) {
	return r.merge(ctx, func(rt Runtime) ([]Status, error) { return rt.List(ctx) })
}

// Recover recovers both runtimes' instances.
func (r *Router) Recover(ctx context.Context) ([]Status, error) {
	return r.merge(ctx, func(rt Runtime) ([]Status, error) { return rt.Recover(ctx) })
}

func (r *Router) merge(_ context.Context, f func(Runtime) ([]Status, error)) ([]Status, error) {
	var out []Status
	for _, rt := range []Runtime{r.vm, r.ct} {
		sts, err := f(rt)
		if err != nil {
			return nil, fmt.Errorf("%s runtime: %w", rt.Name(), err)
		}
		for _, st := range sts {
			r.remember(st.ID, rt)
		}
		out = append(out, sts...)
	}
	return out, nil
}

// Subscribe merges both runtimes' events; the channel closes when ctx
// ends.
func (r *Router) Subscribe(ctx context.Context) <-chan Event {
	out := make(chan Event, 64)
	var wg sync.WaitGroup
	for _, rt := range []Runtime{r.vm, r.ct} {
		ch := rt.Subscribe(ctx)
		wg.Go(func() {
			for ev := range ch {
				select {
				case out <- ev:
				default: // best-effort, as the port says
				}
			}
		})
	}
	go func() { wg.Wait(); close(out) }()
	return out
}

// RunOrphanLoop runs the orphan loops of the runtimes that have one.
func (r *Router) RunOrphanLoop(ctx context.Context, every time.Duration) {
	var wg sync.WaitGroup
	for _, rt := range []Runtime{r.vm, r.ct} {
		if s, ok := rt.(OrphanSweeper); ok {
			wg.Go(func() { s.RunOrphanLoop(ctx, every) })
		}
	}
	wg.Wait()
}

// Close releases both runtimes.
func (r *Router) Close() error {
	var errs []error
	for _, rt := range []Runtime{r.vm, r.ct} {
		if c, ok := rt.(Releaser); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}
