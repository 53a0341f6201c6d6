package docker

import (
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/docker/dockertest"
	"github.com/drover-dev/drover/internal/node/runtime/runtimetest"
)

// TestEngineRestart: the engine goes away and comes back (its containers
// stop with it); the adapter's event stream reconnects by itself, and the
// instance starts again and is Ready, seen on the same subscription.
func TestEngineRestart(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	eng, err := dockertest.StartEngine(ctx, r.reg.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	rt, err := New(ctx, Options{Host: eng.Host, Root: t.TempDir(), Network: "host"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	events := rt.Subscribe(ctx)
	spec := r.serverSpec(t, "survivor")
	destroyAtEnd(t, rt, spec.ID)
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Start(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, spec.ID, runtime.EventReady, 20*time.Second)
	if err := eng.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := rt.Inspect(ctx, spec.ID)
	if err != nil || st.State == runtime.StateRunning {
		t.Fatalf("after the engine restart: %+v, %v", st, err)
	}
	time.Sleep(eventsBackoffMax) // the stream has had time to fail and reconnect
	if _, err := rt.Start(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, spec.ID, runtime.EventStarted, 20*time.Second)
	waitEvent(t, events, spec.ID, runtime.EventReady, 20*time.Second)
}

// TestConformance runs the runtime port's conformance suite against the
// real engine with the test server image.
func TestConformance(t *testing.T) {
	r := env(t)
	var mu sync.Mutex
	roots := map[*testing.T]string{}
	rts := map[*testing.T]*Runtime{}
	newRT := func(t *testing.T) runtime.Runtime {
		root := t.TempDir()
		rt := r.newRuntime(t, root)
		mu.Lock()
		roots[t], rts[t] = root, rt
		mu.Unlock()
		return rt
	}
	reopen := func(t *testing.T) runtime.Runtime {
		mu.Lock()
		root, old := roots[t], rts[t]
		mu.Unlock()
		old.Close() // the old agent exits; its containers keep running
		rt := r.newRuntime(t, root)
		mu.Lock()
		rts[t] = rt
		mu.Unlock()
		return rt
	}
	runtimetest.Run(t, newRT, func(t *testing.T, id string) runtime.Spec { return r.serverSpec(t, id) },
		runtimetest.Options{ReadyTimeout: 20 * time.Second, Graceful: 10 * time.Second, Reopen: reopen})
}
