package docker

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestUnreachableEngine: seed 003's "Cannot connect to Docker daemon"
// becomes an error naming the socket tried and what is missing.
func TestUnreachableEngine(t *testing.T) {
	_, err := New(context.Background(), Options{Host: "unix:///nonexistent/docker.sock", Root: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "docker engine not reachable at unix:///nonexistent/docker.sock: the socket does not exist") {
		t.Fatalf("New: %v", err)
	}
}

// TestValidate: what a container cannot be given is a field error.
func TestValidate(t *testing.T) {
	r := &Runtime{opts: Options{AllowedDirs: []string{"/srv/volumes"}}}
	base := runtime.Spec{ID: "a", Image: runtime.Image{Kind: runtime.ImageOCI, Ref: "reg/app:v1"}}
	tests := []struct {
		name   string
		mutate func(*runtime.Spec)
		field  string
		reason api.ReasonCode
	}{
		{"disk image", func(s *runtime.Spec) { s.Image = runtime.Image{URL: "file:///a", SHA256: "ab"} }, "spec.image", api.ReasonImagePullFailed},
		{"digest", func(s *runtime.Spec) { s.Image.Digest = "md5:x" }, "spec.container.digest", api.ReasonImagePullFailed},
		{"vm section", func(s *runtime.Spec) { s.VM = &runtime.VMSpec{} }, "spec.vm", api.ReasonContainerStartFailed},
		{"host path outside", func(s *runtime.Spec) { s.Volumes = []runtime.Volume{{Source: "/etc", Target: "/x"}} },
			"spec.container.volumes[0].source", api.ReasonVolumeAttachFailed},
		{"host path escaping", func(s *runtime.Spec) {
			s.Volumes = []runtime.Volume{{Source: "/srv/volumes/../../etc", Target: "/x"}}
		}, "spec.container.volumes[0].source", api.ReasonVolumeAttachFailed},
		{"over the secrets", func(s *runtime.Spec) { s.Volumes = []runtime.Volume{{Source: "v", Target: SecretsTarget}} },
			"spec.container.volumes[0].target", api.ReasonVolumeAttachFailed},
		{"microVM volume size", func(s *runtime.Spec) { s.Volumes = []runtime.Volume{{Source: "v", Target: "/v", SizeGiB: 5}} },
			"spec.container.volumes[0]", api.ReasonVolumeAttachFailed},
		{"serial marker", func(s *runtime.Spec) { s.Readiness.SerialMarker = "READY" }, "spec.readiness.serial_marker", api.ReasonContainerStartFailed},
		{"ulimit", func(s *runtime.Spec) { s.Container = &runtime.ContainerSpec{Ulimits: map[string]int64{"core": 1}} },
			"spec.container.ulimits", api.ReasonContainerStartFailed},
		{"gpus all and one", func(s *runtime.Spec) { s.Devices.GPUs = []string{"all", "0"} }, "spec.container.gpus", api.ReasonContainerStartFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			tt.mutate(&s)
			err := r.validate(s)
			if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tt.field+":") || runtime.ReasonOf(err, "") != tt.reason {
				t.Fatalf("validate: %v, want %s (%s)", err, tt.field, tt.reason)
			}
		})
	}
	ok := base
	ok.Volumes = []runtime.Volume{{Source: "/srv/volumes/a", Target: "/a"}, {Source: "cache", Target: "/cache"}}
	if err := r.validate(ok); err != nil {
		t.Fatalf("valid volumes: %v", err)
	}
}

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
