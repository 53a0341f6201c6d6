package docker

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/docker/dockertest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestPodman: the same adapter drives Podman's Docker-compatible service
// (runtime runc, ulimits of 1024): detected as podman, pull, start, Ready
// by HTTP path, graceful stop, destroy; GPUs are asked as CDI names.
func TestPodman(t *testing.T) {
	r := env(t)
	if why := dockertest.PodmanUnavailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and no podman: " + why)
		}
		t.Skip("skipping: " + why)
	}
	ctx := testCtx(t)
	eng, err := dockertest.StartPodman(ctx, r.reg.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	rt, err := New(ctx, Options{Host: eng.Host, Root: t.TempDir(), Network: "host",
		Ulimits: map[string]int64{"nofile": 1024, "nproc": 1024}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	if e := rt.Engine(); e.Name != "podman" || e.Version == "" {
		t.Fatalf("engine %+v, want podman", e)
	}
	events := rt.Subscribe(ctx)
	spec := r.serverSpec(t, "pod1")
	destroyAtEnd(t, rt, spec.ID)
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Start(ctx, spec.ID); err != nil {
		t.Fatalf("start: %v\n%s", err, eng.Log())
	}
	waitEvent(t, events, spec.ID, runtime.EventReady, 30*time.Second)
	if res, err := rt.Stop(ctx, spec.ID, 10*time.Second); err != nil || res.HardStopped {
		t.Fatalf("stop: %+v, %v", res, err)
	}
	if st, _ := rt.Inspect(ctx, spec.ID); st.State != runtime.StateStopped {
		t.Fatalf("state %s, want stopped", st.State)
	}

	gpu := r.busyboxSpec("pod-gpu", "true")
	gpu.Devices.GPUs = []string{"all"}
	destroyAtEnd(t, rt, gpu.ID)
	// No CDI spec here (and Podman 4.3's compatible API does not resolve
	// CDI names): the refusal says what to install.
	if _, err = rt.Create(ctx, gpu); runtime.ReasonOf(err, "") != api.ReasonContainerStartFailed || !strings.Contains(err.Error(), "GPU not accessible") {
		t.Fatalf("GPU create without a CDI spec: %v", err)
	}
}
