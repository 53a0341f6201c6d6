package docker

import (
	"context"
	"errors"
	"strings"
	"testing"

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
