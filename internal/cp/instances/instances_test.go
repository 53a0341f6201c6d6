package instances

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

func validCreate() api.CreateInstanceRequest {
	return api.CreateInstanceRequest{Name: "web-1", Group: "web", Spec: api.InstanceSpec{
		Image: api.Artifact{URL: "https://img.example/base.qcow2", SHA256: strings.Repeat("ab", 32)},
		VCPUs: 1, MemoryMiB: 64,
		Network:   api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 80}, {Name: "ssh", GuestPort: 22, HostPort: 2222}}},
		Readiness: api.Readiness{TCPPort: 80, SerialMarker: "READY"},
	}}
}

func TestValidateCreate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*api.CreateInstanceRequest)
		named  bool
		want   []string // fields with errors, in order
	}{
		{"valid", func(*api.CreateInstanceRequest) {}, true, nil},
		{"valid direct boot, file image, tap", func(r *api.CreateInstanceRequest) {
			r.Spec.Image.URL = "file:///var/lib/drover/images/a.img"
			r.Spec.Boot = &api.DirectBoot{Kernel: r.Spec.Image, Initrd: &r.Spec.Image, Cmdline: "console=ttyS0"}
			r.Spec.Network = api.NetworkSpec{Mode: api.NetworkTap, Bridge: "br0", MAC: "52:54:00:12:34:56"}
			r.Spec.Readiness.TCPPort = 8080 // reached directly on tap
		}, true, nil},
		{"name", func(r *api.CreateInstanceRequest) { r.Name = "Web_1" }, true, []string{"name"}},
		{"name too long", func(r *api.CreateInstanceRequest) { r.Name = strings.Repeat("a", 64) }, true, []string{"name"}},
		{"template ignores name", func(r *api.CreateInstanceRequest) { r.Name = ""; r.Group = "X" }, false, nil},
		{"group leaves room for -n", func(r *api.CreateInstanceRequest) { r.Group = strings.Repeat("g", 57) }, true, []string{"group"}},
		{"host id", func(r *api.CreateInstanceRequest) { r.HostID = "Bad Host" }, true, []string{"host_id"}},
		{"sizes", func(r *api.CreateInstanceRequest) {
			r.Spec.VCPUs, r.Spec.MemoryMiB, r.Spec.DiskGiB, r.Spec.GPUs = 0, 63, -1, -1
		}, true, []string{"spec.vcpus", "spec.memory_mib", "spec.disk_gib", "spec.gpus"}},
		{"image scheme and digest", func(r *api.CreateInstanceRequest) {
			r.Spec.Image = api.Artifact{URL: "ftp://x/y", SHA256: strings.Repeat("AB", 32)}
		}, true, []string{"spec.image.url", "spec.image.sha256"}},
		{"image missing", func(r *api.CreateInstanceRequest) { r.Spec.Image = api.Artifact{} }, true,
			[]string{"spec.image.url", "spec.image.sha256"}},
		{"relative file url", func(r *api.CreateInstanceRequest) { r.Spec.Image.URL = "file:img.qcow2" }, true, []string{"spec.image.url"}},
		{"http without host", func(r *api.CreateInstanceRequest) { r.Spec.Image.URL = "http:///x" }, true, []string{"spec.image.url"}},
		{"boot artifacts", func(r *api.CreateInstanceRequest) {
			r.Spec.Boot = &api.DirectBoot{Kernel: api.Artifact{URL: "https://k/vmlinuz", SHA256: "00"},
				Initrd: &api.Artifact{URL: "gopher://x", SHA256: strings.Repeat("0", 64)}}
		}, true, []string{"spec.boot.kernel.sha256", "spec.boot.initrd.url"}},
		{"tap needs bridge, refuses forwards", func(r *api.CreateInstanceRequest) { r.Spec.Network.Mode = api.NetworkTap }, true,
			[]string{"spec.network.bridge", "spec.network.forwards"}},
		{"unknown mode", func(r *api.CreateInstanceRequest) { r.Spec.Network.Mode = "bridge" }, true, []string{"spec.network.mode"}},
		{"bridge without tap", func(r *api.CreateInstanceRequest) { r.Spec.Network.Bridge = "br0" }, true, []string{"spec.network.bridge"}},
		{"mac", func(r *api.CreateInstanceRequest) { r.Spec.Network.MAC = "nope" }, true, []string{"spec.network.mac"}},
		{"forwards", func(r *api.CreateInstanceRequest) {
			r.Spec.Network.Forwards = []api.PortForward{{Name: "a", GuestPort: 0}, {Name: "a", GuestPort: 80, HostPort: 70000},
				{Name: "b", GuestPort: 81, HostPort: 9000}, {Name: "c", GuestPort: 82, HostPort: 9000}}
		}, true, []string{"spec.network.forwards[0].guest_port", "spec.network.forwards[1].name", "spec.network.forwards[1].host_port",
			"spec.network.forwards[3].host_port"}},
		{"readiness port without forward", func(r *api.CreateInstanceRequest) { r.Spec.Readiness.TCPPort = 8080 }, true,
			[]string{"spec.readiness.tcp_port"}},
		{"readiness", func(r *api.CreateInstanceRequest) {
			r.Spec.Readiness = api.Readiness{SerialMarker: "a\nb", TCPPort: 70000, Timeout: api.Duration(-time.Second)}
		}, true, []string{"spec.readiness.tcp_port", "spec.readiness.serial_marker", "spec.readiness.timeout"}},
		{"slots", func(r *api.CreateInstanceRequest) { r.Spec.Slots = []string{"slot-0", "slot-0", ""} }, true,
			[]string{"spec.slots[1]", "spec.slots[2]"}},
		{"cloud-init", func(r *api.CreateInstanceRequest) {
			r.Spec.CloudInit = &api.CloudInit{Hostname: "A", User: "root user", SSHAuthorizedKeys: []string{"ssh-ed25519 AAA", "a\nb"}}
		}, true, []string{"spec.cloud_init.hostname", "spec.cloud_init.user", "spec.cloud_init.ssh_authorized_keys[1]"}},
		{"health check, secrets, graceful", func(r *api.CreateInstanceRequest) {
			r.Spec.HealthCheck = &api.HealthCheck{Interval: api.Duration(time.Millisecond), FailureThreshold: -1}
			r.Spec.Secrets = []string{"ok", "../etc/passwd"}
			r.Spec.GracefulTimeout = api.Duration(-1)
		}, true, []string{"spec.health_check.interval", "spec.health_check.failure_threshold", "spec.secrets[1]", "spec.graceful_timeout"}},
		{"labels", func(r *api.CreateInstanceRequest) { r.HostLabels = map[string]string{"": "x"} }, true, []string{"host_labels"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := validCreate()
			tt.mutate(&req)
			var got []string
			for _, fe := range validateCreate(req, tt.named) {
				got = append(got, fe.Field)
				if fe.Message == "" {
					t.Errorf("%s: empty message", fe.Field)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("fields %v, want %v", got, tt.want)
			}
		})
	}
}

func TestInstancesETag(t *testing.T) {
	set := []api.DesiredInstance{
		{ID: "i-000000000001", Generation: 1, DesiredState: api.DesiredRunning},
		{ID: "i-000000000002", Generation: 3, DesiredState: api.DesiredStopped},
	}
	base := instancesETag(false, set)
	if len(base) != 64 || base != instancesETag(false, slices.Clone(set)) {
		t.Fatalf("etag %q is not a stable hex SHA-256", base)
	}
	// A spec or name change without a generation bump is not a change.
	same := slices.Clone(set)
	same[0].Name, same[0].Spec.VCPUs = "renamed", 8
	if instancesETag(false, same) != base {
		t.Error("etag depends on fields outside (id, generation, desired state)")
	}
	changes := map[string]func([]api.DesiredInstance) (bool, []api.DesiredInstance){
		"draining":   func(s []api.DesiredInstance) (bool, []api.DesiredInstance) { return true, s },
		"generation": func(s []api.DesiredInstance) (bool, []api.DesiredInstance) { s[1].Generation++; return false, s },
		"desired": func(s []api.DesiredInstance) (bool, []api.DesiredInstance) {
			s[0].DesiredState = api.DesiredDeleted
			return false, s
		},
		"removed": func(s []api.DesiredInstance) (bool, []api.DesiredInstance) { return false, s[:1] },
		"empty":   func(s []api.DesiredInstance) (bool, []api.DesiredInstance) { return false, nil },
	}
	seen := map[string]string{base: "base"}
	for name, change := range changes {
		d, s := change(slices.Clone(set))
		tag := instancesETag(d, s)
		if prev, dup := seen[tag]; dup {
			t.Errorf("%s: etag equals that of %s", name, prev)
		}
		seen[tag] = name
	}
	// Field boundaries are unambiguous: "i-1" at 12 is not "i-11" at 2.
	a := instancesETag(false, []api.DesiredInstance{{ID: "i-1", Generation: 12, DesiredState: api.DesiredRunning}})
	b := instancesETag(false, []api.DesiredInstance{{ID: "i-11", Generation: 2, DesiredState: api.DesiredRunning}})
	if a == b {
		t.Error("etag encoding is ambiguous across field boundaries")
	}
}

func TestInstanceSuffix(t *testing.T) {
	for name, want := range map[string]int{"web-1": 1, "web-10": 10, "web-0": 0, "web-01": -1, "web-x": -1,
		"web": -1, "webb-1": -1, "web-1-2": -1, "web--1": -1} {
		if got := instanceSuffix("web", name); got != want {
			t.Errorf("instanceSuffix(web, %q) = %d, want %d", name, got, want)
		}
	}
}

func TestInstanceIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := newInstanceID()
		if len(id) != 14 || !strings.HasPrefix(id, "i-") || strings.Trim(id[2:], "0123456789abcdef") != "" || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}
