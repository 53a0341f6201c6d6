package instances

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

func validContainer() api.CreateInstanceRequest {
	return api.CreateInstanceRequest{Name: "llm-1", Spec: api.InstanceSpec{
		Runtime: api.RuntimeDocker, VCPUs: 2, MemoryMiB: 1024,
		Container: &api.ContainerSpec{Image: "registry.example/vllm:v1", Digest: "sha256:" + strings.Repeat("ab", 32),
			Args: []string{"--model", "m"}, Env: map[string]string{"HF_HOME": "/cache"},
			Volumes: []api.VolumeMount{{Source: "hf-cache", Target: "/cache"}, {Source: "/var/lib/drover/volumes/x", Target: "/x"}},
			GPUs:    []string{"0", "1"}, Ulimits: &api.Ulimits{NoFile: 1024}},
		Network:   api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 8000}}},
		Readiness: api.Readiness{TCPPort: 8000, HTTPPath: "/health"},
	}}
}

func TestValidateContainer(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*api.CreateInstanceRequest)
		want   []string
	}{
		{"valid", func(*api.CreateInstanceRequest) {}, nil},
		{"unknown runtime", func(r *api.CreateInstanceRequest) { r.Spec.Runtime = "lxc" }, []string{"spec.runtime", "spec.image.url", "spec.image.sha256"}},
		{"container needs runtime docker", func(r *api.CreateInstanceRequest) {
			r.Spec.Runtime = ""
			r.Spec.Image = api.Artifact{URL: "https://img.example/a.qcow2", SHA256: strings.Repeat("ab", 32)}
		}, []string{"spec.container", "spec.readiness.http_path"}},
		{"no container", func(r *api.CreateInstanceRequest) { r.Spec.Container = nil }, []string{"spec.container"}},
		{"VM fields", func(r *api.CreateInstanceRequest) { r.Spec.Slots = []string{"s"} }, []string{"spec.runtime"}},
		{"image and digest", func(r *api.CreateInstanceRequest) {
			r.Spec.Container.Image = "a b"
			r.Spec.Container.Digest = "sha256:XY"
		}, []string{"spec.container.image", "spec.container.digest"}},
		{"volumes", func(r *api.CreateInstanceRequest) {
			r.Spec.Container.Volumes = []api.VolumeMount{{Source: "../x", Target: "rel"}}
		}, []string{"spec.container.volumes[0].target", "spec.container.volumes[0].source"}},
		{"volume size and format are microVM-only", func(r *api.CreateInstanceRequest) {
			r.Spec.Container.Volumes = []api.VolumeMount{{Source: "hf-cache", Target: "/cache", SizeGiB: 10, Format: "qcow2"}}
		}, []string{"spec.container.volumes[0].size_gib", "spec.container.volumes[0].format"}},
		{"gpus", func(r *api.CreateInstanceRequest) { r.Spec.Container.GPUs = []string{"all", "0"} },
			[]string{"spec.container.gpus[0]"}},
		{"ulimits", func(r *api.CreateInstanceRequest) { r.Spec.Container.Ulimits.NProc = -1 }, []string{"spec.container.ulimits"}},
		{"http path", func(r *api.CreateInstanceRequest) { r.Spec.Readiness.HTTPPath = "health" }, []string{"spec.readiness.http_path"}},
		{"registry auth", func(r *api.CreateInstanceRequest) { r.Spec.Container.RegistryAuth = "creds" }, []string{"spec.container.registry_auth"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := validContainer()
			tt.mutate(&req)
			var got []string
			for _, fe := range validateCreate(req, true) {
				got = append(got, fe.Field)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("fields %v, want %v", got, tt.want)
			}
		})
	}
}

// TestContainerResources: a container's GPUs count by the ones it names.
func TestContainerResources(t *testing.T) {
	s := validContainer().Spec
	if got := s.Resources().GPUs; got != 2 {
		t.Fatalf("GPUs %d, want 2", got)
	}
	s.Container.GPUs = []string{"all"}
	s.GPUs = 4
	if got := s.Resources().GPUs; got != 4 {
		t.Fatalf("all: GPUs %d, want 4", got)
	}
}

// TestPlaceByRuntime: a container goes only to a host reporting the
// docker runtime; a pinned host without it is a spec.runtime field error.
func TestPlaceByRuntime(t *testing.T) {
	withRuntimes := func(h store.Host, rts ...string) store.Host {
		h.Capabilities, _ = json.Marshal(api.Capabilities{Runtimes: rts, ContainerEngine: "docker"})
		return h
	}
	vmOnly := capHost("vm-only", api.HostHealthy, api.Capacity{VCPUs: 64, MemoryMiB: 1 << 20, GPUs: 8}, nil)
	both := withRuntimes(capHost("both", api.HostHealthy, api.Capacity{VCPUs: 8, MemoryMiB: 8192, GPUs: 2}, nil), "qemu", "docker")
	f := testFleet(vmOnly, both)
	s := &Room{}
	req := validContainer()
	host, err := s.pickHost(t.Context(), f, req)
	if err != nil || host != "both" {
		t.Fatalf("placed on %q, %v", host, err)
	}
	f.add("both", "other", api.DesiredRunning, req.Spec) // its 2 GPUs are taken
	if _, err := s.pickHost(t.Context(), f, req); err == nil || !strings.Contains(err.Error(), "vm-only: runtime docker not available") {
		t.Fatalf("no room: %v", err)
	}
	req.HostID = "vm-only"
	_, err = s.pickHost(t.Context(), f, req)
	if err == nil || !strings.Contains(err.Error(), "spec.runtime") {
		t.Fatalf("pinned to a VM-only host: %v", err)
	}
	vm := validCreate()
	if host, err := s.pickHost(t.Context(), testFleet(vmOnly, both), vm); err != nil || host != "vm-only" {
		t.Fatalf("a VM: %q, %v", host, err)
	}
}

// TestPlaceGPUs: a container's GPUs must be in the host's inventory (by
// index or UUID; a pinned host without one is a field error) and not held
// by another container, whichever name that one used.
func TestPlaceGPUs(t *testing.T) {
	i0, i1 := 0, 1
	h := capHost("gpu-box", api.HostHealthy, api.Capacity{VCPUs: 16, MemoryMiB: 65536, GPUs: 2}, nil)
	h.Capabilities, _ = json.Marshal(api.Capabilities{Runtimes: []string{"docker"}, Inventory: &api.HostInventory{
		GPUs: []api.GPU{{Index: &i0, UUID: "GPU-aaaa"}, {Index: &i1, UUID: "GPU-bbbb"}}}})
	f := testFleet(h)
	s := &Room{}
	req := validContainer()
	req.Spec.Container.GPUs = []string{"0"}
	if host, err := s.pickHost(t.Context(), f, req); err != nil || host != "gpu-box" {
		t.Fatalf("GPU 0: %q, %v", host, err)
	}
	f.add("gpu-box", "first", api.DesiredRunning, req.Spec)
	req.Spec.Container.GPUs = []string{"GPU-aaaa"} // GPU 0 by its UUID
	if _, err := s.pickHost(t.Context(), f, req); err == nil || !strings.Contains(err.Error(), "GPU GPU-aaaa is held by instance first") {
		t.Fatalf("held GPU: %v", err)
	}
	req.Spec.Container.GPUs = []string{"GPU-bbbb"}
	if _, err := s.pickHost(t.Context(), f, req); err != nil {
		t.Fatalf("free GPU: %v", err)
	}
	req.HostID, req.Spec.Container.GPUs = "gpu-box", []string{"7"}
	if _, err := s.pickHost(t.Context(), f, req); err == nil || !strings.Contains(err.Error(), "spec.container.gpus[0]") {
		t.Fatalf("absent GPU on a pinned host: %v", err)
	}
}
