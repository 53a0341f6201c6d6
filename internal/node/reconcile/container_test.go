package reconcile

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestToRuntimeSpecContainer: a spec with runtime docker becomes an OCI
// runtime spec with no VM section.
func TestToRuntimeSpecContainer(t *testing.T) {
	d := api.DesiredInstance{ID: "c", Spec: api.InstanceSpec{Runtime: api.RuntimeDocker, VCPUs: 2, MemoryMiB: 512,
		Container: &api.ContainerSpec{Image: "reg.example/app:v1", Digest: "sha256:ab", Command: []string{"/srv"}, Args: []string{"-v"},
			Env: map[string]string{"A": "1"}, Volumes: []api.VolumeMount{{Source: "cache", Target: "/cache", ReadOnly: true}},
			GPUs: []string{"0"}, Ulimits: &api.Ulimits{NoFile: 1024}, RegistryAuth: "creds"},
		Network:   api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 8000}}},
		Readiness: api.Readiness{TCPPort: 8000, HTTPPath: "/health"}, Secrets: []string{"creds"}}}
	secrets := map[string][]byte{"creds": []byte("{}")}
	got := ToRuntimeSpec(d, secrets)
	want := runtime.Spec{ID: "c", Owner: Owner, Image: runtime.Image{Kind: runtime.ImageOCI, Ref: "reg.example/app:v1", Digest: "sha256:ab"},
		Command: []string{"/srv"}, Args: []string{"-v"}, Env: map[string]string{"A": "1"}, Ports: d.Spec.Network.Forwards,
		Volumes: []runtime.Volume{{Source: "cache", Target: "/cache", ReadOnly: true}}, Devices: runtime.Devices{GPUs: []string{"0"}},
		Resources: runtime.Resources{VCPUs: 2, MemoryMiB: 512}, Readiness: runtime.Readiness{Readiness: d.Spec.Readiness},
		Secrets: secrets, Container: &runtime.ContainerSpec{Ulimits: map[string]int64{"nofile": 1024}, RegistryAuth: "creds"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ToRuntimeSpec (-want +got):\n%s", diff)
	}
}
