package runtime_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestSpecJSONRoundTrip: every encoded field survives; Secrets and the
// health-check cadence are not encoded.
func TestSpecJSONRoundTrip(t *testing.T) {
	in := runtime.Spec{
		ID: "web-1", Owner: "reconciler",
		Image:   runtime.Image{Kind: runtime.ImageOCI, Ref: "ghcr.io/acme/web:1", Digest: "sha256:ab"},
		Command: []string{"/web"}, Args: []string{"-v"}, Env: map[string]string{"A": "1"},
		Ports:     []api.PortForward{{Name: "http", GuestPort: 80, HostPort: 8080}},
		Volumes:   []runtime.Volume{{Source: "/srv/web", Target: "/data", ReadOnly: true}},
		Devices:   runtime.Devices{GPUs: []string{"0", "GPU-8c1e"}, PCI: []string{"0000:3b:00.0"}},
		Resources: runtime.Resources{VCPUs: 2, MemoryMiB: 512, DiskGiB: 4},
		Readiness: runtime.Readiness{Readiness: api.Readiness{TCPPort: 80, Timeout: api.Duration(time.Minute)},
			HealthCheck: &api.HealthCheck{FailureThreshold: 3}},
		Secrets: map[string][]byte{"k": []byte("v")},
		VM: &runtime.VMSpec{BootDevice: "/dev/nvme1n1", Accel: "tcg", SeedISO: "/s.iso",
			Boot:      &api.DirectBoot{Kernel: api.Artifact{URL: "file:///k", SHA256: "cd"}, Cmdline: "console=ttyS0"},
			Network:   runtime.VMNetwork{Mode: api.NetworkTap, Bridge: "br0", MAC: "52:54:00:00:00:01"},
			CloudInit: &api.CloudInit{User: "ops", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA"}}},
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out runtime.Spec
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	want := in
	want.Secrets, want.Readiness.HealthCheck = nil, nil
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("round trip (-want +got):\n%s\n%s", diff, b)
	}
}

// TestSpecUnmarshalLegacy: the flat VM spec older agents persisted (qemu's
// spec.json) decodes into the new shape, so an upgraded agent re-adopts
// their instances with the spec it would build itself.
func TestSpecUnmarshalLegacy(t *testing.T) {
	tests := []struct {
		name, in string
		want     runtime.Spec
	}{
		{"reconciler vm", `{"id":"a","image":{"url":"file:///i","sha256":"ab"},"disk_gib":2,
			"boot":{"kernel":{"url":"file:///k","sha256":"cd"},"cmdline":"console=ttyS0"},"vcpus":1,"memory_mib":256,
			"network":{"mode":"user","forwards":[{"name":"ssh","guest_port":22}]},"cloud_init":{"hostname":"a"},
			"readiness":{"serial_marker":"READY","timeout":"2s"},"pci_devices":["0000:17:00.0"],"owner":"reconciler"}`,
			runtime.Spec{ID: "a", Owner: "reconciler", Image: runtime.Image{URL: "file:///i", SHA256: "ab"},
				Ports:     []api.PortForward{{Name: "ssh", GuestPort: 22}},
				Devices:   runtime.Devices{PCI: []string{"0000:17:00.0"}},
				Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 256, DiskGiB: 2},
				Readiness: runtime.Readiness{Readiness: api.Readiness{SerialMarker: "READY", Timeout: api.Duration(2 * time.Second)}},
				VM: &runtime.VMSpec{Boot: &api.DirectBoot{Kernel: api.Artifact{URL: "file:///k", SHA256: "cd"}, Cmdline: "console=ttyS0"},
					Network: runtime.VMNetwork{Mode: api.NetworkUser}, CloudInit: &api.CloudInit{Hostname: "a"}}}},
		{"slice vm on a boot device", `{"id":"vm-1","image":{"url":"","sha256":""},"boot_device":"/dev/nvme1n1","vcpus":4,
			"memory_mib":8192,"accel":"kvm","network":{"mode":"tap","bridge":"br-slice","mac":"52:54:00:aa:bb:cc"},
			"seed_iso":"/var/lib/drover/ci/vm-1/seed.iso","readiness":{},"owner":"slice"}`,
			runtime.Spec{ID: "vm-1", Owner: "slice", Resources: runtime.Resources{VCPUs: 4, MemoryMiB: 8192},
				VM: &runtime.VMSpec{BootDevice: "/dev/nvme1n1", Accel: "kvm", SeedISO: "/var/lib/drover/ci/vm-1/seed.iso",
					Network: runtime.VMNetwork{Mode: api.NetworkTap, Bridge: "br-slice", MAC: "52:54:00:aa:bb:cc"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got runtime.Spec
			if err := json.Unmarshal([]byte(tc.in), &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("legacy decode (-want +got):\n%s", diff)
			}
		})
	}
	var s runtime.Spec
	if err := json.Unmarshal([]byte(`[1]`), &s); err == nil {
		t.Error("a JSON array decoded as a spec")
	}
}
