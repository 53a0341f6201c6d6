package agent_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
)

// extrasRuntime is a mock with the optional extras a runtime may offer
// (runtime.OrphanSweeper, runtime.Releaser), recording the agent's calls.
type extrasRuntime struct {
	*mock.Runtime

	mu     sync.Mutex
	sweeps []time.Duration // RunOrphanLoop's every, per call
	closed int
}

func (r *extrasRuntime) RunOrphanLoop(ctx context.Context, every time.Duration) {
	r.mu.Lock()
	r.sweeps = append(r.sweeps, every)
	r.mu.Unlock()
	<-ctx.Done()
}

func (r *extrasRuntime) Close() error {
	r.mu.Lock()
	r.closed++
	r.mu.Unlock()
	return nil
}

func (r *extrasRuntime) calls() (sweeps []time.Duration, closed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.sweeps...), r.closed
}

// recordingFactory registers as "fake": it records the options the agent
// builds it with and returns rt (or err).
type recordingFactory struct {
	rt  noderuntime.Runtime
	err error

	mu   sync.Mutex
	opts []noderuntime.Options
}

func (f *recordingFactory) build(_ context.Context, o noderuntime.Options) (noderuntime.Runtime, error) {
	f.mu.Lock()
	f.opts = append(f.opts, o)
	f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	return f.rt, nil
}

func (f *recordingFactory) calls() []noderuntime.Options {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]noderuntime.Options(nil), f.opts...)
}

// TestRuntimeFromRegistry: the agent builds NODE_AGENT_RUNTIME through the
// registry it was configured with, passing its runtime dir, image cache,
// the probe's accelerator, the orphan counter, the OCI cache bound and the
// microVM network settings, and the runtime's own
// settings to its typed config; it runs the runtime's
// orphan loop while it runs and lets go of it (Close) when it stops.
func TestRuntimeFromRegistry(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	stateDir := t.TempDir()
	rt := &extrasRuntime{Runtime: mock.New(mock.Options{})}
	fac := &recordingFactory{rt: rt}
	cfg := testConfig(f, stateDir)
	binary := make(chan string, 1) // the runtime's own setting, as its factory got it
	entry := noderuntime.WithConfig(func(v noderuntime.Values) (string, error) { return v["BINARY"], nil },
		func(ctx context.Context, o noderuntime.Options, bin string) (noderuntime.Runtime, error) {
			binary <- bin
			return fac.build(ctx, o)
		}, noderuntime.Setting{Name: "BINARY", Default: "fake-vmm"})
	cfg.Runtime, cfg.Runtimes = "fake", noderuntime.Registry{"fake": entry}
	cfg.RuntimeSettings = map[string]string{"NODE_AGENT_FAKE_BINARY": "/opt/fake-vmm"}
	cfg.OCICacheMaxGiB, cfg.MicroVMBridge, cfg.MicroVMCIDR, cfg.MicroVMDNS = 7, "brx0", "10.9.0.0/24", "10.9.0.53, 9.9.9.9"
	a := startAgentConfig(t, f, cfg, (&counter{}).handlers()) // the probe finds tcg only

	eventually(t, "the orphan loop", func() bool { s, _ := rt.calls(); return len(s) > 0 })
	opts := fac.calls()
	if len(opts) != 1 {
		t.Fatalf("factory called %d times, want once", len(opts))
	}
	o := opts[0]
	if want := filepath.Join(stateDir, "runtime"); o.Root != want {
		t.Errorf("Root = %q, want %q", o.Root, want)
	}
	if o.Accel != accel.TCG {
		t.Errorf("Accel = %q, want the probe's only working one, %q", o.Accel, accel.TCG)
	}
	if got := <-binary; got != "/opt/fake-vmm" {
		t.Errorf("the factory's own config has BINARY %q, want NODE_AGENT_FAKE_BINARY's /opt/fake-vmm", got)
	}
	if o.OCICacheMaxBytes != 7<<30 || o.MicroVMBridge != "brx0" || o.MicroVMCIDR != "10.9.0.0/24" || !slices.Equal(o.MicroVMDNS, []string{"10.9.0.53", "9.9.9.9"}) {
		t.Errorf("OCI cache bound %d, microVM bridge %q, CIDR %q, DNS %q: want NODE_AGENT_OCI_CACHE_MAX_GIB 7 GiB, brx0, 10.9.0.0/24, [10.9.0.53 9.9.9.9]",
			o.OCICacheMaxBytes, o.MicroVMBridge, o.MicroVMCIDR, o.MicroVMDNS)
	}
	if o.Images == nil || o.Log == nil || o.OnOrphanRemoved == nil {
		t.Errorf("Images, Log or OnOrphanRemoved not set: %+v", o)
	}
	o.OnOrphanRemoved(filepath.Join(stateDir, "runtime", "overlays", "gone.qcow2"))
	if got := agentMetric(t, a, "drover_agent_orphan_overlays_removed_total"); got != 1 {
		t.Errorf("drover_agent_orphan_overlays_removed_total = %v, want 1", got)
	}
	if sweeps, _ := rt.calls(); sweeps[0] != time.Minute {
		t.Errorf("RunOrphanLoop every %s, want 1m", sweeps[0])
	}

	a.stop(t)
	if sweeps, closed := rt.calls(); len(sweeps) != 1 || closed != 1 {
		t.Errorf("after stop: %d orphan loops, %d Close calls; want 1 and 1", len(sweeps), closed)
	}
}

// TestRuntimeFactoryFails: a runtime that cannot be built (no accelerator
// for QEMU, say) leaves the host running without instances: it enrols,
// heartbeats and runs tasks.
func TestRuntimeFactoryFails(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	fac := &recordingFactory{err: errors.New("no working accelerator for QEMU")}
	cfg := testConfig(f, t.TempDir())
	cfg.Runtime, cfg.Runtimes = "fake", noderuntime.Registry{"fake": noderuntime.Plain(fac.build)}
	startAgentConfig(t, f, cfg, (&counter{}).handlers()) // waits for a heartbeat
	if n := len(fac.calls()); n != 1 {
		t.Errorf("factory called %d times, want once", n)
	}
}

// TestNewUnregisteredRuntime: agent.New refuses a runtime its registry does
// not have, naming the ones it has.
func TestNewUnregisteredRuntime(t *testing.T) {
	t.Parallel()
	cfg := agent.Config{ControlPlaneURL: "https://cp:8443", OSFamily: "linux", StateDir: t.TempDir(),
		Runtime: "qemu", Runtimes: noderuntime.Registry{mock.Name: mock.Entry()}}
	_, err := agent.New(cfg)
	if err == nil || !strings.Contains(err.Error(), `NODE_AGENT_RUNTIME "qemu"`) || !strings.Contains(err.Error(), "one of mock, none") {
		t.Fatalf("New = %v, want an error naming NODE_AGENT_RUNTIME and the registered runtimes", err)
	}
	cfg.Runtime = agent.RuntimeNone
	cfg.Runtimes = nil
	if _, err := agent.New(cfg); err != nil {
		t.Fatalf("New with NODE_AGENT_RUNTIME=none and no registry: %v", err)
	}
}
