package docker

import (
	"strconv"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/reconcile"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preset"
)

// TestPresetReadiness runs the vLLM and Ollama presets' expanded specs on
// the engine, as the agent would (reconcile.ToRuntimeSpec), with two
// changes only: the image is the test server (which answers vLLM's
// /health and Ollama's /api/tags, the real images are not pulled here),
// told the preset's port, and the GPUs are dropped (this machine has
// none; TestGPURequests covers them). The preset's own readiness (port
// and HTTP path), forward, volumes, shm size and resources must bring the
// container to Ready.
func TestPresetReadiness(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	root := t.TempDir()
	rt := r.newRuntime(t, root)
	events := rt.Subscribe(ctx)
	for _, c := range []struct {
		in       api.PresetRequest
		wantPath string
	}{
		{api.PresetRequest{Name: api.PresetVLLM, Model: "tiny/test-model", Port: freePort(t), MemoryMiB: 256, VCPUs: 1}, "/health"},
		{api.PresetRequest{Name: api.PresetOllama, Model: "tiny", Port: freePort(t), GPUs: []string{api.GPUsNone}, MemoryMiB: 256, VCPUs: 1}, "/api/tags"},
	} {
		t.Run(c.in.Name, func(t *testing.T) {
			spec, errs := preset.Expand(c.in, "preset")
			if len(errs) > 0 {
				t.Fatalf("expand: %v", errs)
			}
			if spec.Readiness.HTTPPath != c.wantPath || spec.Readiness.TCPPort != c.in.Port {
				t.Fatalf("preset readiness %+v, want %s on %d", spec.Readiness, c.wantPath, c.in.Port)
			}
			id := "preset-" + c.in.Name
			rs := reconcile.ToRuntimeSpec(api.DesiredInstance{ID: id, Name: id, Spec: spec, DesiredState: api.DesiredRunning}, nil)
			rs.Owner = "test"
			rs.Image = runtime.Image{Kind: runtime.ImageOCI, Ref: r.app.Ref, Digest: r.app.Digest}
			rs.Command, rs.Args = []string{"/testserver"}, nil
			if rs.Env == nil {
				rs.Env = map[string]string{}
			}
			rs.Env["PORT"] = strconv.Itoa(c.in.Port)
			rs.Devices.GPUs = nil
			destroyAtEnd(t, rt, id)
			if _, err := rt.Create(ctx, rs); err != nil {
				t.Fatal(err)
			}
			if _, err := rt.Start(ctx, id); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, events, id, runtime.EventReady, 30*time.Second)
			if err := rt.Probe(ctx, id); err != nil {
				t.Errorf("probe: %v", err)
			}
			ins, err := rt.inspect(ctx, "inspect", id)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(spec.Container.ShmSizeMiB) << 20; want > 0 && ins.HostConfig.ShmSize != want {
				t.Errorf("shm size %d, want %d", ins.HostConfig.ShmSize, want)
			}
			if got := ins.HostConfig.Memory; got != int64(c.in.MemoryMiB)<<20 {
				t.Errorf("memory %d, want %d MiB", got, c.in.MemoryMiB)
			}
			vols := map[string]string{}
			for _, m := range ins.Mounts {
				vols[m.Name] = m.Destination
			}
			for _, v := range spec.Container.Volumes {
				if vols[v.Source] != v.Target {
					t.Errorf("volume %s → %s not mounted (mounts %v)", v.Source, v.Target, vols)
				}
			}
		})
	}
}
