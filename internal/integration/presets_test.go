package integration

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
)

// startGPUNode enrols hostID and heartbeats a capacity of 32 vCPU, 64 GiB
// and gpus GPUs until the test ends; its capabilities report the docker
// runtime and gpus GPUs.
func startGPUNode(e *env, hostID string, gpus int) nodeIdentity {
	e.t.Helper()
	id := e.enroll(hostID, e.createHost(hostID).Token)
	hb := api.Heartbeat{Capacity: &api.CapacityReport{Total: api.Capacity{VCPUs: 32, MemoryMiB: 65536, DiskGiB: 100, GPUs: gpus}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			e.nodeCall(id.client, http.MethodPost, nodePath(hostID, "/heartbeat"), hb)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	e.t.Cleanup(func() { cancel(); <-done })
	e.waitHostStatus(hostID, api.HostHealthy, 10*time.Second)
	return id
}

func gpuCaps(gpus int, local ...api.PresetRequest) api.Capabilities {
	c := validCaps()
	c.Runtimes, c.ContainerEngine, c.GPUCount, c.LocalWorkloads = []string{"qemu", "docker"}, "docker", gpus, local
	return c
}

// TestPresets: POST /api/v1/instances with a preset stores its expanded
// container spec (exactly one of spec and preset; a preset needing GPUs is
// refused on a host reporting none with preset.gpus), and the local
// workloads an agent declares in its capabilities become instances
// <host>-<preset> pinned to it, created by node:<id>, updated and deleted
// as the declaration changes.
func TestPresets(t *testing.T) {
	p := &eventProbe{Store: openSQLite(t)} // every record written with its event
	e := startEnv(t, p, func(c *server.Config) { c.VCPUAllocationRatio = 1 })
	gpu, cpu := startGPUNode(e, "gpu-1", 2), startGPUNode(e, "cpu-1", 0)
	put := func(id nodeIdentity, c api.Capabilities) {
		t.Helper()
		if st, code, body := e.nodeCall(id.client, http.MethodPut, nodePath(id.id, "/capabilities"), c); st != http.StatusNoContent {
			t.Fatalf("PUT capabilities: %d %s %s", st, code, body)
		}
	}
	put(cpu, gpuCaps(0))
	put(gpu, gpuCaps(2, api.PresetRequest{Name: api.PresetVLLM}, api.PresetRequest{Name: api.PresetOllama, GPUs: []string{"none"}}))

	list := func() map[string]api.Instance {
		var ins []api.Instance
		if st := e.op(http.MethodGet, "/api/v1/instances?host=gpu-1", nil, &ins); st != http.StatusOK {
			t.Fatalf("list: %d", st)
		}
		out := map[string]api.Instance{}
		for _, in := range ins {
			out[in.Name] = in
		}
		return out
	}
	got := list()
	vllm, ollama := got["gpu-1-vllm"], got["gpu-1-ollama"]
	if vllm.CreatedBy != "node:gpu-1" || vllm.HostID != "gpu-1" || vllm.Spec.Runtime != api.RuntimeDocker ||
		vllm.Spec.Preset == nil || vllm.Spec.Readiness.HTTPPath != "/health" ||
		!slices.Contains(vllm.Spec.Container.Args, "mistralai/Mistral-7B-Instruct-v0.1") {
		t.Fatalf("vllm local workload: %+v", vllm)
	}
	if ollama.CreatedBy != "node:gpu-1" || ollama.Spec.Readiness.HTTPPath != "/api/tags" || len(ollama.Spec.Container.GPUs) != 0 {
		t.Fatalf("ollama local workload: %+v", ollama)
	}
	put(gpu, gpuCaps(2, api.PresetRequest{Name: api.PresetVLLM}, api.PresetRequest{Name: api.PresetOllama, GPUs: []string{"none"}}))
	if again := list(); again["gpu-1-vllm"].Generation != 1 || len(again) != 2 {
		t.Fatalf("an unchanged declaration changed the records: %+v", again)
	}

	// The agent restarts with -enable-ollama -ollama-model llama3 only.
	put(gpu, gpuCaps(2, api.PresetRequest{Name: api.PresetOllama, Model: "llama3", GPUs: []string{"none"}}))
	got = list()
	if v := got["gpu-1-vllm"]; v.DesiredState != api.DesiredDeleted {
		t.Fatalf("undeclared vllm: %+v", v)
	}
	if o := got["gpu-1-ollama"]; o.Generation != 2 || o.Spec.Preset.Model != "llama3" {
		t.Fatalf("updated ollama: %+v", o)
	}
	if !e.auditHas("instance.update", ollama.ID, "ok") {
		t.Error("no audit record of the update")
	}

	// The operator API.
	var in api.Instance
	if st := e.op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "llm", HostID: "gpu-1",
		Preset: &api.PresetRequest{Name: api.PresetVLLM, GPUs: []string{"0", "1"}, TensorParallelSize: 2, Port: 8100}}, &in); st != http.StatusCreated {
		t.Fatalf("create with preset: %d", st)
	}
	if c := in.Spec.Container; c == nil || !slices.Equal(c.GPUs, []string{"0", "1"}) || in.Spec.Resources().GPUs != 2 ||
		in.Spec.Network.Forwards[0].GuestPort != 8100 || in.CreatedBy != "operator:test" {
		t.Fatalf("stored: %+v", in.Spec)
	}
	for _, tc := range []struct {
		req   api.CreateInstanceRequest
		field string
	}{
		{api.CreateInstanceRequest{Name: "x", HostID: "cpu-1", Preset: &api.PresetRequest{Name: api.PresetVLLM}}, "preset.gpus"},
		{api.CreateInstanceRequest{Name: "x", Preset: &api.PresetRequest{Name: api.PresetVLLM, GPUs: []string{"0"}, TensorParallelSize: 2}}, "preset.tensor_parallel_size"},
		{api.CreateInstanceRequest{Name: "x", Spec: apiSpec(1, 128), Preset: &api.PresetRequest{Name: api.PresetOllama}}, "preset"},
		{api.CreateInstanceRequest{Name: "x", Preset: &api.PresetRequest{Name: "tgi"}}, "preset.name"},
	} {
		var raw []byte
		if st := e.op(http.MethodPost, "/api/v1/instances", tc.req, &raw); st != http.StatusUnprocessableEntity ||
			!strings.Contains(string(raw), `"field":"`+tc.field+`"`) {
			t.Errorf("%+v: %d %s, want a field error on %s", tc.req.Preset, st, raw, tc.field)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.missed) > 0 {
		t.Fatalf("records visible before their events:\n%s", strings.Join(p.missed, "\n"))
	}
}
