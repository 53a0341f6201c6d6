// Package runtimetest owns the conformance suite of runtime.Runtime: every
// adapter (mock, qemu, later firecracker and docker) runs the same subtests
// through Run, which pin down the semantics documented on the interface
// (create → start → ready → graceful stop; idempotent create, start, stop
// and destroy; ErrExists for a different spec; ErrNotFound for unknown ids;
// List after Destroy; Recover by a fresh runtime over the same state). Each
// subtest boots at most one instance, since real adapters boot real VMs. It
// must not import any adapter.
package runtimetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Owner is the owner the suite sets on every spec it creates.
const Owner = "runtimetest"

// Options tunes the suite for slow adapters.
type Options struct {
	// ReadyTimeout bounds the wait for an instance to become Ready after
	// Start (default 10s).
	ReadyTimeout time.Duration
	// Graceful is the graceful timeout passed to Stop where the suite
	// expects a clean shutdown of a Ready guest (default 30s).
	Graceful time.Duration
	// Reopen returns a fresh runtime over the same state as the one newRT
	// last returned for t (the same state directory; running instances
	// keep running), as an agent restart would. Nil skips the Recover case.
	Reopen func(t *testing.T) runtime.Runtime
}

// NewRuntime builds a fresh, empty runtime for one subtest.
type NewRuntime func(t *testing.T) runtime.Runtime

// SpecFunc returns a valid spec for id that boots and becomes Ready.
type SpecFunc func(t *testing.T, id string) runtime.Spec

type suite struct {
	newRT NewRuntime
	spec  SpecFunc
	opts  Options
}

// Run runs the conformance suite. Subtests run one after another (each may
// boot a VM).
func Run(t *testing.T, newRT NewRuntime, spec SpecFunc, opts Options) {
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 10 * time.Second
	}
	if opts.Graceful <= 0 {
		opts.Graceful = 30 * time.Second
	}
	s := &suite{newRT: newRT, spec: spec, opts: opts}
	cases := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"Lifecycle", s.lifecycle},
		{"Idempotent", s.idempotent},
		{"CreateDifferentSpec", s.createDifferentSpec},
		{"UnknownID", s.unknownID},
		{"ListAfterDestroy", s.listAfterDestroy},
		{"Recover", s.recover},
	}
	for _, tc := range cases {
		t.Run(tc.name, tc.fn)
	}
}

func (s *suite) ctx(t *testing.T) context.Context {
	d := 3*s.opts.ReadyTimeout + 3*s.opts.Graceful + 30*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// specFor returns the adapter's spec for id with the suite's owner.
func (s *suite) specFor(t *testing.T, id string) runtime.Spec {
	t.Helper()
	sp := s.spec(t, id)
	if sp.ID != id {
		t.Fatalf("spec(%q) returned id %q", id, sp.ID)
	}
	sp.Owner = Owner
	return sp
}

// cleanup destroys id when the subtest ends, whatever happened.
func cleanup(t *testing.T, rt runtime.Runtime, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := rt.Destroy(ctx, id); err != nil {
			t.Errorf("cleanup: Destroy(%s): %v", id, err)
		}
	})
}

func (s *suite) lifecycle(t *testing.T) {
	ctx := s.ctx(t)
	rt := s.newRT(t)
	if rt.Name() == "" {
		t.Error("Name() is empty")
	}
	subCtx, unsubscribe := context.WithCancel(ctx)
	defer unsubscribe()
	events := rt.Subscribe(subCtx)

	const id = "rtt-lifecycle"
	cleanup(t, rt, id)
	st, err := rt.Create(ctx, s.specFor(t, id))
	must(t, "Create", err)
	if st.ID != id || st.State != runtime.StateCreated || st.Owner != Owner {
		t.Fatalf("Create status = {ID:%q State:%q Owner:%q}, want {%q %q %q}", st.ID, st.State, st.Owner, id, runtime.StateCreated, Owner)
	}
	st, err = rt.Start(ctx, id)
	must(t, "Start", err)
	if st.State != runtime.StateRunning || st.StartedAt.IsZero() {
		t.Fatalf("Start status = {State:%q StartedAt:%v}, want running with a start time", st.State, st.StartedAt)
	}
	s.waitReady(ctx, t, rt, id, events)
	st, err = rt.Inspect(ctx, id)
	must(t, "Inspect", err)
	if st.State != runtime.StateRunning || !st.Ready {
		t.Fatalf("Inspect after ready = {State:%q Ready:%v}, want running and ready", st.State, st.Ready)
	}
	if err := rt.Probe(ctx, id); err != nil {
		t.Errorf("Probe of a ready instance: %v", err)
	}

	res, err := rt.Stop(ctx, id, s.opts.Graceful)
	must(t, "Stop", err)
	if res.HardStopped {
		t.Errorf("Stop of a ready guest with %v graceful: HardStopped, want a clean shutdown", s.opts.Graceful)
	}
	st, err = rt.Inspect(ctx, id)
	must(t, "Inspect after Stop", err)
	if st.State != runtime.StateStopped || st.Ready {
		t.Errorf("Inspect after Stop = {State:%q Ready:%v}, want stopped, not ready", st.State, st.Ready)
	}
	if err := rt.Probe(ctx, id); err == nil {
		t.Error("Probe of a stopped instance returned nil, want an error")
	}

	must(t, "Destroy", rt.Destroy(ctx, id))
	if _, err := rt.Inspect(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Inspect after Destroy: %v, want ErrNotFound", err)
	}

	// The subscription closes once its context ends.
	unsubscribe()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("event channel still open 5s after its context ended")
		}
	}
}

func (s *suite) idempotent(t *testing.T) {
	ctx := s.ctx(t)
	rt := s.newRT(t)
	const id = "rtt-idempotent"
	cleanup(t, rt, id)
	spec := s.specFor(t, id)
	_, err := rt.Create(ctx, spec)
	must(t, "Create", err)
	st, err := rt.Create(ctx, spec)
	must(t, "second Create with the same spec", err)
	if st.State != runtime.StateCreated {
		t.Errorf("second Create state = %q, want %q", st.State, runtime.StateCreated)
	}

	first, err := rt.Start(ctx, id)
	must(t, "Start", err)
	second, err := rt.Start(ctx, id)
	must(t, "second Start", err)
	if second.State != runtime.StateRunning || second.PID != first.PID || !second.StartedAt.Equal(first.StartedAt) {
		t.Errorf("second Start = {State:%q PID:%d StartedAt:%v}, want the same running process {PID:%d StartedAt:%v}",
			second.State, second.PID, second.StartedAt, first.PID, first.StartedAt)
	}
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Errorf("Create with the same spec while running: %v", err)
	}

	// The guest may still be booting: allow a short graceful stop only.
	_, err = rt.Stop(ctx, id, min(s.opts.Graceful, 2*time.Second))
	must(t, "Stop", err)
	res, err := rt.Stop(ctx, id, s.opts.Graceful)
	must(t, "second Stop", err)
	if res.HardStopped {
		t.Error("second Stop of a stopped instance reports HardStopped, want a no-op")
	}
	if st, err := rt.Inspect(ctx, id); err != nil || st.State != runtime.StateStopped {
		t.Fatalf("Inspect after Stop = (%q, %v), want stopped", st.State, err)
	}

	// A stopped instance starts again.
	st, err = rt.Start(ctx, id)
	must(t, "Start after Stop", err)
	if st.State != runtime.StateRunning {
		t.Errorf("Start after Stop state = %q, want running", st.State)
	}

	must(t, "Destroy", rt.Destroy(ctx, id))
	must(t, "second Destroy", rt.Destroy(ctx, id))
	if _, err := rt.Inspect(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Inspect after Destroy: %v, want ErrNotFound", err)
	}
}

func (s *suite) createDifferentSpec(t *testing.T) {
	ctx := s.ctx(t)
	rt := s.newRT(t)
	const id = "rtt-different-spec"
	cleanup(t, rt, id)
	spec := s.specFor(t, id)
	_, err := rt.Create(ctx, spec)
	must(t, "Create", err)

	other := s.specFor(t, id)
	other.Resources.MemoryMiB += 64
	_, err = rt.Create(ctx, other)
	if !errors.Is(err, runtime.ErrExists) {
		t.Fatalf("Create with a different spec: %v, want ErrExists", err)
	}
	var rerr *runtime.Error
	if !errors.As(err, &rerr) {
		t.Errorf("Create with a different spec: %T, want a *runtime.Error", err)
	}
	st, err := rt.Inspect(ctx, id)
	must(t, "Inspect", err)
	if st.Spec.Resources.MemoryMiB != spec.Resources.MemoryMiB {
		t.Errorf("after the refused Create, MemoryMiB = %d, want the original %d", st.Spec.Resources.MemoryMiB, spec.Resources.MemoryMiB)
	}
}

func (s *suite) unknownID(t *testing.T) {
	ctx := s.ctx(t)
	rt := s.newRT(t)
	const id = "rtt-never-created"
	if _, err := rt.Inspect(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Inspect(unknown): %v, want ErrNotFound", err)
	}
	if _, err := rt.Start(ctx, id); err == nil {
		t.Error("Start(unknown) returned nil, want an error")
	}
	if err := rt.Probe(ctx, id); err == nil {
		t.Error("Probe(unknown) returned nil, want an error")
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Errorf("Destroy(unknown): %v, want nil", err)
	}
	list, err := rt.List(ctx)
	must(t, "List", err)
	for _, st := range list {
		if st.ID == id {
			t.Errorf("List contains the unknown id %q", id)
		}
	}
}

func (s *suite) listAfterDestroy(t *testing.T) {
	ctx := s.ctx(t)
	rt := s.newRT(t)
	const a, b = "rtt-list-a", "rtt-list-b"
	cleanup(t, rt, a)
	cleanup(t, rt, b)
	for _, id := range []string{a, b} {
		_, err := rt.Create(ctx, s.specFor(t, id))
		must(t, "Create "+id, err)
	}
	if got := listed(ctx, t, rt); !got[a] || !got[b] {
		t.Fatalf("List = %v, want both %s and %s", got, a, b)
	}
	must(t, "Destroy", rt.Destroy(ctx, a))
	if got := listed(ctx, t, rt); got[a] || !got[b] {
		t.Errorf("List after Destroy(%s) = %v, want only %s", a, got, b)
	}
}

func (s *suite) recover(t *testing.T) {
	if s.opts.Reopen == nil {
		t.Skip("adapter has no Reopen: Recover is not checked")
	}
	ctx := s.ctx(t)
	rt := s.newRT(t)
	const id = "rtt-recover"
	cleanup(t, rt, id)
	_, err := rt.Create(ctx, s.specFor(t, id))
	must(t, "Create", err)
	started, err := rt.Start(ctx, id)
	must(t, "Start", err)
	s.waitReady(ctx, t, rt, id, nil)

	rt2 := s.opts.Reopen(t)
	cleanup(t, rt2, id)
	list, err := rt2.Recover(ctx)
	must(t, "Recover", err)
	var found *runtime.Status
	for i := range list {
		if list[i].ID == id {
			found = &list[i]
		}
	}
	if found == nil {
		t.Fatalf("Recover returned %d instances, none %q", len(list), id)
	}
	if found.State != runtime.StateRunning || !found.Adopted || found.Owner != Owner || found.Spec.ID != id {
		t.Errorf("recovered = {State:%q Adopted:%v Owner:%q Spec.ID:%q}, want {running true %q %q}",
			found.State, found.Adopted, found.Owner, found.Spec.ID, Owner, id)
	}
	if started.PID != 0 && found.PID != started.PID {
		t.Errorf("recovered PID = %d, want the running process %d (no second boot)", found.PID, started.PID)
	}
	st, err := rt2.Inspect(ctx, id)
	must(t, "Inspect after Recover", err)
	if st.State != runtime.StateRunning {
		t.Errorf("Inspect after Recover state = %q, want running", st.State)
	}
	if _, err := rt2.Stop(ctx, id, s.opts.Graceful); err != nil {
		t.Errorf("Stop of the recovered instance: %v", err)
	}
	must(t, "Destroy", rt2.Destroy(ctx, id))
}

// waitReady waits for EventReady on events (when not nil) or for Inspect to
// say Ready, whichever comes first (event delivery is best-effort).
func (s *suite) waitReady(ctx context.Context, t *testing.T, rt runtime.Runtime, id string, events <-chan runtime.Event) {
	t.Helper()
	deadline := time.NewTimer(s.opts.ReadyTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.ID == id && ev.Kind == runtime.EventReady {
				return
			}
			if ev.ID == id && ev.Kind == runtime.EventExited {
				t.Fatalf("instance exited while waiting for ready: %s %s %s", ev.State, ev.Reason, ev.Detail)
			}
		case <-poll.C:
			st, err := rt.Inspect(ctx, id)
			must(t, "Inspect", err)
			if st.Ready {
				return
			}
			if st.State != runtime.StateRunning {
				t.Fatalf("instance is %s (%s %s) while waiting for ready", st.State, st.ExitReason, st.ExitDetail)
			}
		case <-deadline.C:
			t.Fatalf("instance %s not ready within %v", id, s.opts.ReadyTimeout)
		case <-ctx.Done():
			t.Fatalf("waiting for ready: %v", ctx.Err())
		}
	}
}

func listed(ctx context.Context, t *testing.T, rt runtime.Runtime) map[string]bool {
	t.Helper()
	list, err := rt.List(ctx)
	must(t, "List", err)
	out := map[string]bool{}
	for _, st := range list {
		out[st.ID] = true
		if st.Owner != Owner {
			t.Errorf("List: %s has owner %q, want %q", st.ID, st.Owner, Owner)
		}
	}
	return out
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
