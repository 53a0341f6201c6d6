package docker

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// TestVolumes: a named volume outlives Destroy; a host path under the
// allowed directories is bind-mounted.
func TestVolumes(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	root := t.TempDir()
	rt := r.newRuntime(t, root)
	spec := r.busyboxSpec("vols", "echo hi > /data/f && echo hi > /host/f && sleep 600")
	spec.Volumes = []runtime.Volume{{Source: "drover-test-keep", Target: "/data"}, {Source: root, Target: "/host"}}
	t.Cleanup(func() {
		rt.cli.VolumeRemove(context.Background(), "drover-test-keep", client.VolumeRemoveOptions{Force: true})
	})
	destroyAtEnd(t, rt, spec.ID)
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Start(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	waitFile(t, root+"/f")
	if err := rt.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.cli.VolumeInspect(ctx, "drover-test-keep", client.VolumeInspectOptions{}); err != nil {
		t.Fatalf("the named volume went with the container: %v", err)
	}
}

// waitFile waits for a file the container writes through a bind mount.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
