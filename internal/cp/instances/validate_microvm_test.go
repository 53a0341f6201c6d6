package instances

import (
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

func TestValidateMicroVM(t *testing.T) {
	base := api.InstanceSpec{Runtime: api.RuntimeMicroVM, VCPUs: 1, MemoryMiB: 128,
		Container: &api.ContainerSpec{Image: "registry.example/app:1"},
		Network:   api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 8080}}},
		Readiness: api.Readiness{TCPPort: 8080, HTTPPath: "/health"}}
	if errs := validateSpec(base, "spec"); len(errs) != 0 {
		t.Fatalf("valid OCI microVM: %+v", errs)
	}
	rootfs := base
	rootfs.Container = &api.ContainerSpec{Command: []string{"/srv"}}
	rootfs.Image = api.Artifact{URL: "https://example.com/r.ext4", SHA256: strings.Repeat("a", 64)}
	if errs := validateSpec(rootfs, "spec"); len(errs) != 0 {
		t.Fatalf("valid rootfs microVM: %+v", errs)
	}
	bridge := base
	bridge.Network.Mode = api.NetworkBridge
	bridge.Readiness = api.Readiness{TCPPort: 9000} // the lease's address: no forward needed
	if errs := validateSpec(bridge, "spec"); len(errs) != 0 {
		t.Fatalf("microVM in mode bridge: %+v", errs)
	}
	vm := api.InstanceSpec{VCPUs: 1, MemoryMiB: 128, Image: rootfs.Image, Network: api.NetworkSpec{Mode: api.NetworkBridge}}
	if errs := validateSpec(vm, "spec"); len(errs) == 0 || errs[0].Field != "spec.network.mode" {
		t.Errorf("a VM in mode bridge: %+v, want a spec.network.mode error", errs)
	}
	for name, tc := range map[string]struct {
		mod   func(*api.InstanceSpec)
		field string
	}{
		"nothing to boot":   {func(s *api.InstanceSpec) { s.Container = nil }, "spec.container"},
		"both images":       {func(s *api.InstanceSpec) { s.Image = rootfs.Image }, "spec.image"},
		"rootfs no command": {func(s *api.InstanceSpec) { *s = rootfs; s.Container = nil }, "spec.container.command"},
		"boot":              {func(s *api.InstanceSpec) { s.Boot = &api.DirectBoot{} }, "spec.runtime"},
		"tap":               {func(s *api.InstanceSpec) { s.Network.Mode = api.NetworkTap }, "spec.network"},
		"bridge with name":  {func(s *api.InstanceSpec) { s.Network.Mode, s.Network.Bridge = api.NetworkBridge, "br0" }, "spec.network"},
		"volumes": {func(s *api.InstanceSpec) {
			s.Container = &api.ContainerSpec{Image: "r/a:1", Volumes: []api.VolumeMount{{Source: "d", Target: "/d"}}}
		}, "spec.container"},
		"http path": {func(s *api.InstanceSpec) { s.Readiness.HTTPPath = "health" }, "spec.readiness.http_path"},
	} {
		s := base
		tc.mod(&s)
		errs := validateSpec(s, "spec")
		found := false
		for _, e := range errs {
			found = found || e.Field == tc.field
		}
		if !found {
			t.Errorf("%s: errors %+v lack %s", name, errs, tc.field)
		}
	}
}
