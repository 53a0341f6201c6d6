package instances

import (
	"fmt"
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
		"gpus": {func(s *api.InstanceSpec) {
			s.Container = &api.ContainerSpec{Image: "r/a:1", GPUs: []string{"0"}}
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

// TestValidateMicroVMVolumes: a microVM mounts named volumes only, each
// once, at a clean absolute target the init does not own, with a size
// and format it can create; every error names the field.
func TestValidateMicroVMVolumes(t *testing.T) {
	withVols := func(vols ...api.VolumeMount) api.InstanceSpec {
		return api.InstanceSpec{Runtime: api.RuntimeMicroVM, VCPUs: 1, MemoryMiB: 128,
			Container: &api.ContainerSpec{Image: "registry.example/app:1", Volumes: vols}}
	}
	ok := withVols(api.VolumeMount{Source: "pgdata", Target: "/var/lib/postgresql/data", SizeGiB: 10},
		api.VolumeMount{Source: "cache.v2", Target: "/cache", Format: "qcow2", ReadOnly: true},
		api.VolumeMount{Source: "plain", Target: "/plain", Format: "raw"})
	if errs := validateSpec(ok, "spec"); len(errs) != 0 {
		t.Fatalf("valid volumes: %+v", errs)
	}
	many := make([]api.VolumeMount, api.MaxMicroVMVolumes+1)
	for i := range many {
		many[i] = api.VolumeMount{Source: fmt.Sprintf("v%d", i), Target: fmt.Sprintf("/v%d", i)}
	}
	for _, tc := range []struct {
		name  string
		vols  []api.VolumeMount
		field string
	}{
		{"host path", []api.VolumeMount{{Source: "/srv/data", Target: "/data"}}, "spec.container.volumes[0].source"},
		{"path trick", []api.VolumeMount{{Source: "a..b", Target: "/data"}}, "spec.container.volumes[0].source"},
		{"upper case", []api.VolumeMount{{Source: "Data", Target: "/data"}}, "spec.container.volumes[0].source"},
		{"empty source", []api.VolumeMount{{Target: "/data"}}, "spec.container.volumes[0].source"},
		{"same volume twice", []api.VolumeMount{{Source: "d", Target: "/a"}, {Source: "d", Target: "/b"}}, "spec.container.volumes[1].source"},
		{"relative target", []api.VolumeMount{{Source: "d", Target: "data"}}, "spec.container.volumes[0].target"},
		{"unclean target", []api.VolumeMount{{Source: "d", Target: "/data/../etc"}}, "spec.container.volumes[0].target"},
		{"root target", []api.VolumeMount{{Source: "d", Target: "/"}}, "spec.container.volumes[0].target"},
		{"proc target", []api.VolumeMount{{Source: "d", Target: "/proc/x"}}, "spec.container.volumes[0].target"},
		{"secrets target", []api.VolumeMount{{Source: "d", Target: "/run/drover/secrets"}}, "spec.container.volumes[0].target"},
		{"same target twice", []api.VolumeMount{{Source: "a", Target: "/d"}, {Source: "b", Target: "/d"}}, "spec.container.volumes[1].target"},
		{"negative size", []api.VolumeMount{{Source: "d", Target: "/d", SizeGiB: -1}}, "spec.container.volumes[0].size_gib"},
		{"huge size", []api.VolumeMount{{Source: "d", Target: "/d", SizeGiB: api.MaxVolumeSizeGiB + 1}}, "spec.container.volumes[0].size_gib"},
		{"format", []api.VolumeMount{{Source: "d", Target: "/d", Format: "vmdk"}}, "spec.container.volumes[0].format"},
		{"too many", many, "spec.container.volumes"},
	} {
		errs := validateSpec(withVols(tc.vols...), "spec")
		if len(errs) != 1 || errs[0].Field != tc.field {
			t.Errorf("%s: errors %+v, want exactly one on %s", tc.name, errs, tc.field)
		}
	}
}
