package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestInstancesCreatePreset: --preset sends a preset the control plane
// expands into a container spec; bad preset input and a host without GPUs
// are field errors.
func TestInstancesCreatePreset(t *testing.T) {
	host := func(id string, gpus int) store.Host {
		capa, _ := json.Marshal(api.CapacityReport{Total: api.Capacity{VCPUs: 16, MemoryMiB: 65536, DiskGiB: 50, GPUs: gpus}})
		caps, _ := json.Marshal(api.Capabilities{Runtimes: []string{"qemu", "docker"}, ContainerEngine: "docker", GPUCount: gpus})
		return store.Host{ID: id, OSFamily: api.OSLinux, Enabled: true, Status: api.HostHealthy, Capacity: capa, Capabilities: caps}
	}
	apiURL, token := startServer(t, func(ctx context.Context, s store.Store) error {
		if err := s.CreateHost(ctx, host("g1", 2)); err != nil {
			return err
		}
		return s.CreateHost(ctx, host("cpu1", 0))
	})
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append(args, "--api", apiURL, "--token", token), &Env{Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	code, out, errOut := run("instances", "create", "llm", "--preset", "vllm", "--model", "org/model", "--gpus", "0,1",
		"--tensor-parallel", "2", "--node", "g1", "--json")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	var in api.Instance
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	c := in.Spec.Container
	if in.Spec.Runtime != api.RuntimeDocker || c == nil || !slices.Equal(c.GPUs, []string{"0", "1"}) ||
		!slices.Equal(c.Args, []string{"--model", "org/model", "--tensor-parallel-size", "2", "--max-model-len", "4096", "--port", "8000"}) ||
		in.Spec.Preset == nil || in.Spec.Preset.Name != "vllm" || in.Spec.Readiness.HTTPPath != "/health" {
		t.Fatalf("stored spec: %+v container %+v", in.Spec, c)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"instances", "create", "x", "--preset", "vllm", "--gpus", "0,1", "--tensor-parallel", "3", "--host", "g1"}, 1, "preset.tensor_parallel_size"},
		{[]string{"instances", "create", "x", "--preset", "ollama", "--host", "cpu1"}, 1, "preset.gpus"},
		{[]string{"instances", "create", "x", "--preset", "ollama", "--port", "70000", "--host", "g1"}, 1, "preset.port"},
		{[]string{"instances", "create", "x", "--model", "m", "--host", "g1"}, 1, "go with --preset"},
		{[]string{"instances", "create", "x", "--preset", "vllm", "--image-url", "https://x/y", "--host", "g1"}, 1, "replaces --spec"},
		{[]string{"instances", "create", "x", "--preset", "tgi"}, 2, "--preset"},
		{[]string{"instances", "create", "x", "--gpus", "0,1", "--host", "g1"}, 1, "GPU count"},
	} {
		code, _, errOut := run(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: code %d, stderr %q; want %d with %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	code, out, errOut = run("instances", "create", "chat", "--preset", "ollama", "--gpus", "none", "--host", "cpu1", "--json")
	if code != 0 || !strings.Contains(out, `"/api/tags"`) {
		t.Fatalf("ollama on CPU: %d %s %s", code, out, errOut)
	}
}
