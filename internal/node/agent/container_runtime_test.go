package agent_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/agent"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
)

// TestContainerRuntimeBeside: NODE_AGENT_CONTAINER_RUNTIME builds a second
// runtime under its own directory beside NODE_AGENT_RUNTIME; when it cannot
// be built the host still runs the VM runtime.
func TestContainerRuntimeBeside(t *testing.T) {
	t.Parallel()
	for _, ctFails := range []bool{false, true} {
		f := newFakeCP(t)
		stateDir := t.TempDir()
		vm := &recordingFactory{rt: mock.New(mock.Options{})}
		ct := &recordingFactory{rt: mock.New(mock.Options{})}
		if ctFails {
			ct.err = errors.New("docker engine not reachable at unix:///var/run/docker.sock")
		}
		cfg := testConfig(f, stateDir)
		cfg.Runtime, cfg.ContainerRuntime = "fakevm", "fakect"
		cfg.Runtimes = noderuntime.Registry{"fakevm": noderuntime.Plain(vm.build), "fakect": noderuntime.Plain(ct.build)}
		a := startAgentConfig(t, f, cfg, (&counter{}).handlers())
		vo, co := vm.calls(), ct.calls()
		if len(vo) != 1 || len(co) != 1 {
			t.Fatalf("factories called %d and %d times, want once each", len(vo), len(co))
		}
		if want := filepath.Join(stateDir, "runtime"); vo[0].Root != want {
			t.Errorf("VM runtime root %q, want %q", vo[0].Root, want)
		}
		if want := filepath.Join(stateDir, "runtime", "fakect"); co[0].Root != want {
			t.Errorf("container runtime root %q, want %q", co[0].Root, want)
		}
		if co[0].GPUs == nil {
			t.Error("the container runtime gets no GPU inventory")
		}
		a.stop(t)
	}
}

// TestContainerRuntimeConfig: NODE_AGENT_CONTAINER_RUNTIME must be none or
// a registered runtime other than NODE_AGENT_RUNTIME.
func TestContainerRuntimeConfig(t *testing.T) {
	t.Parallel()
	reg := noderuntime.Registry{mock.Name: mock.Entry()}
	for _, c := range []struct{ vm, ct, want string }{
		{"mock", "docker", `NODE_AGENT_CONTAINER_RUNTIME "docker"`},
		{"mock", "mock", `NODE_AGENT_CONTAINER_RUNTIME "mock"`},
		{"mock", "none", ""},
		{"none", "", ""},
	} {
		cfg := agent.Config{ControlPlaneURL: "https://cp:8443", OSFamily: "linux", StateDir: t.TempDir(),
			Runtime: c.vm, ContainerRuntime: c.ct, Runtimes: reg}
		_, err := agent.New(cfg)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("runtime %s, container runtime %s: %v, want %q", c.vm, c.ct, err, c.want)
		}
	}
}
