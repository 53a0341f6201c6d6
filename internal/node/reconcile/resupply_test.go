package reconcile

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestSecretsGivenBackAfterAgentRestart: a runtime that kept an
// instance's secrets only in memory and lost them (the QEMU runtime's
// in-memory seeds after an agent restart) answers Start with
// ErrSecretsNeeded; the reconciler reads the secrets again, Creates with
// them and starts the instance, which reaches Ready.
func TestSecretsGivenBackAfterAgentRestart(t *testing.T) {
	rt := &forgetfulRT{Runtime: mock.New(mock.Options{Log: quiet}), lost: true}
	opts := fastOpts()
	reads := 0
	var mu sync.Mutex
	opts.Secrets = func(_ context.Context, _ string, names []string) (map[string][]byte, error) {
		mu.Lock()
		reads++
		mu.Unlock()
		out := map[string][]byte{}
		for _, n := range names {
			out[n] = []byte("v")
		}
		return out, nil
	}
	rep := newRecorder()
	rec := New(rt, rep, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- rec.Run(ctx) }()
	defer func() { cancel(); <-done }()

	d := desired("a", 1)
	d.Spec.Secrets = []string{"token"}
	rec.SetDesired([]api.DesiredInstance{d}, false)
	waitFor(t, "Ready", func() bool { return slices.Equal(rep.seq("a"), ready) }, func() string { return "" })
	mu.Lock()
	defer mu.Unlock()
	if reads != 2 {
		t.Errorf("secrets read %d times, want 2 (create, then again for the lost seed)", reads)
	}
	if rt.creates() != 2 {
		t.Errorf("Create called %d times, want 2", rt.creates())
	}
}

// forgetfulRT answers the first Start after the first Create with
// ErrSecretsNeeded, as the QEMU runtime does after an agent restart, until
// Create is called again.
type forgetfulRT struct {
	*mock.Runtime
	mu      sync.Mutex
	lost    bool
	created int
}

func (f *forgetfulRT) Create(ctx context.Context, s runtime.Spec) (runtime.Status, error) {
	f.mu.Lock()
	f.created++
	if f.created > 1 {
		f.lost = false
	}
	f.mu.Unlock()
	return f.Runtime.Create(ctx, s)
}

func (f *forgetfulRT) Start(ctx context.Context, id string) (runtime.Status, error) {
	f.mu.Lock()
	lost := f.lost
	f.mu.Unlock()
	if lost {
		return runtime.Status{}, runtime.Errorf(api.ReasonSecretsInjectionFailed, "start", id, "%w", runtime.ErrSecretsNeeded)
	}
	return f.Runtime.Start(ctx, id)
}

func (f *forgetfulRT) creates() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.created
}
