package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

func TestValidate(t *testing.T) {
	root := shortDir(t)
	devDir := filepath.Join(root, "by-id")
	if err := os.Mkdir(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := newTestRuntime(t, root, nil, func(o *Options) {
		o.DeviceDirs = []string{devDir, filepath.Join(root, "nvme")}
	})
	sha := strings.Repeat("b", 64)
	tests := []struct {
		name   string
		mod    func(*runtime.Spec)
		reason api.ReasonCode // "" = valid
	}{
		{"valid", func(*runtime.Spec) {}, ""},
		{"bad id", func(s *runtime.Spec) { s.ID = "Bad/ID" }, api.ReasonVMStartFailed},
		{"no vcpus", func(s *runtime.Spec) { s.Resources.VCPUs = 0 }, api.ReasonVMStartFailed},
		{"tiny memory", func(s *runtime.Spec) { s.Resources.MemoryMiB = 1 }, api.ReasonVMStartFailed},
		{"neither disk", func(s *runtime.Spec) { s.Image = runtime.Image{} }, api.ReasonRootfsBuildFailed},
		{"both disks", func(s *runtime.Spec) { s.VM.BootDevice = devDir + "/nvme-a" }, api.ReasonRootfsBuildFailed},
		{"image without digest", func(s *runtime.Spec) { s.Image.SHA256 = "" }, api.ReasonImagePullFailed},
		{"boot device in by-id", func(s *runtime.Spec) { s.Image = runtime.Image{}; s.VM.BootDevice = devDir + "/nvme-a" }, ""},
		{"boot device by name prefix", func(s *runtime.Spec) { s.Image = runtime.Image{}; s.VM.BootDevice = root + "/nvme0n1" }, ""},
		{"boot device outside", func(s *runtime.Spec) { s.Image = runtime.Image{}; s.VM.BootDevice = "/dev/sda" }, api.ReasonVolumeAttachFailed},
		{"boot device escaping", func(s *runtime.Spec) { s.Image = runtime.Image{}; s.VM.BootDevice = devDir + "/../../sda" }, api.ReasonVolumeAttachFailed},
		{"boot device sibling dir", func(s *runtime.Spec) { s.Image = runtime.Image{}; s.VM.BootDevice = devDir + "-evil/x" }, api.ReasonVolumeAttachFailed},
		{"boot device resized", func(s *runtime.Spec) {
			s.Image = runtime.Image{}
			s.VM.BootDevice = devDir + "/x"
			s.Resources.DiskGiB = 10
		}, api.ReasonRootfsBuildFailed},
		{"kernel without digest", func(s *runtime.Spec) { s.VM.Boot = &api.DirectBoot{Kernel: api.Artifact{URL: "file:///k"}} }, api.ReasonImagePullFailed},
		{"direct boot", func(s *runtime.Spec) {
			s.VM.Boot = &api.DirectBoot{Kernel: api.Artifact{URL: "file:///k", SHA256: sha}, Initrd: &api.Artifact{URL: "file:///i", SHA256: sha}}
		}, ""},
		{"other accel", func(s *runtime.Spec) { s.VM.Accel = "kvm" }, api.ReasonVMStartFailed},
		{"tcg accel", func(s *runtime.Spec) { s.VM.Accel = "tcg" }, ""},
		{"bad mode", func(s *runtime.Spec) { s.VM.Network.Mode = "bridge" }, api.ReasonNetworkSetupFailed},
		{"tap without bridge", func(s *runtime.Spec) { s.VM.Network.Mode = api.NetworkTap }, api.ReasonNetworkSetupFailed},
		{"tap", func(s *runtime.Spec) { s.VM.Network = runtime.VMNetwork{Mode: api.NetworkTap, Bridge: "br0"} }, ""},
		{"tap with forwards", func(s *runtime.Spec) {
			s.VM.Network = runtime.VMNetwork{Mode: api.NetworkTap, Bridge: "br0"}
			s.Ports = []api.PortForward{{GuestPort: 22}}
		}, api.ReasonNetworkSetupFailed},
		{"duplicate forward", func(s *runtime.Spec) {
			s.Ports = []api.PortForward{{Name: "a", GuestPort: 22}, {Name: "a", GuestPort: 23}}
		}, api.ReasonNetworkSetupFailed},
		{"duplicate host port", func(s *runtime.Spec) {
			s.Ports = []api.PortForward{{GuestPort: 22, HostPort: 2222}, {GuestPort: 23, HostPort: 2222}}
		}, api.ReasonNetworkSetupFailed},
		{"bad mac", func(s *runtime.Spec) { s.VM.Network.MAC = "zz" }, api.ReasonNetworkSetupFailed},
		{"bad pci", func(s *runtime.Spec) { s.Devices.PCI = []string{"3b:00"} }, api.ReasonVMStartFailed},
		{"short pci", func(s *runtime.Spec) { s.Devices.PCI = []string{"3b:00.0"} }, ""},
		{"secrets without cloud-init", func(s *runtime.Spec) { s.Secrets = map[string][]byte{"a": []byte("x")} }, api.ReasonSecretsInjectionFailed},
		{"bad secret name", func(s *runtime.Spec) {
			s.VM.CloudInit = &api.CloudInit{}
			s.Secrets = map[string][]byte{"../etc": []byte("x")}
		}, api.ReasonSecretsInjectionFailed},
		{"seed and cloud-init", func(s *runtime.Spec) { s.VM.CloudInit = &api.CloudInit{}; s.VM.SeedISO = "/x.iso" }, api.ReasonRootfsBuildFailed},
		{"tcp readiness without forward", func(s *runtime.Spec) { s.Readiness.TCPPort = 22 }, api.ReasonVMStartFailed},
		{"tcp readiness", func(s *runtime.Spec) {
			s.Readiness.TCPPort = 22
			s.Ports = []api.PortForward{{Name: "ssh", GuestPort: 22}}
		}, ""},
		{"multi-line marker", func(s *runtime.Spec) { s.Readiness.SerialMarker = "a\nb" }, api.ReasonVMStartFailed},
		{"long id for the socket path", func(s *runtime.Spec) { s.ID = strings.Repeat("a", 63) }, ""},
		{"no vm section", func(s *runtime.Spec) { s.VM = nil }, ""},
		{"health check", func(s *runtime.Spec) { s.Readiness.HealthCheck = &api.HealthCheck{FailureThreshold: 2} }, ""},
		{"unknown image kind", func(s *runtime.Spec) { s.Image.Kind = "squashfs" }, api.ReasonImagePullFailed},
		{"disk image with an oci ref", func(s *runtime.Spec) { s.Image.Ref = "docker.io/library/nginx:1" }, api.ReasonImagePullFailed},
		{"command", func(s *runtime.Spec) { s.Command = []string{"/bin/sh"} }, api.ReasonVMStartFailed},
		{"args", func(s *runtime.Spec) { s.Args = []string{"-c", "true"} }, api.ReasonVMStartFailed},
		{"env", func(s *runtime.Spec) { s.Env = map[string]string{"A": "1"} }, api.ReasonVMStartFailed},
		{"volumes", func(s *runtime.Spec) { s.Volumes = []runtime.Volume{{Source: "/srv", Target: "/data"}} }, api.ReasonVolumeAttachFailed},
		{"gpus by index", func(s *runtime.Spec) { s.Devices.GPUs = []string{"0"} }, api.ReasonVMStartFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := runtime.Spec{ID: "vm1", Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}, Image: runtime.Image{URL: "file:///img", SHA256: sha}, VM: &runtime.VMSpec{}}
			tc.mod(&s)
			err := r.validate(s)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("validate: %v, want valid", err)
				}
				return
			}
			if got := runtime.ReasonOf(err, ""); got != tc.reason || !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("validate: %v (reason %q), want reason %q wrapping ErrInvalidSpec", err, got, tc.reason)
			}
		})
	}
}

// TestValidateRefusesOCIImage: an OCI image is a typed spec error that
// names the field, not a failed download.
func TestValidateRefusesOCIImage(t *testing.T) {
	r := newTestRuntime(t, shortDir(t), nil)
	s := runtime.Spec{ID: "oci1", Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128},
		Image: runtime.Image{Kind: runtime.ImageOCI, Ref: "docker.io/library/nginx:1.27", Digest: "sha256:" + strings.Repeat("c", 64)}}
	err := r.validate(s)
	var rerr *runtime.Error
	if !errors.As(err, &rerr) || rerr.Reason != api.ReasonImagePullFailed || rerr.Op != "create" || rerr.ID != "oci1" ||
		!errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "spec.image.kind: oci images need a container or microVM runtime") {
		t.Fatalf("validate: %v, want a *runtime.Error (image_pull_failed) naming spec.image.kind", err)
	}
	if _, err := r.Create(context.Background(), s); runtime.ReasonOf(err, "") != api.ReasonImagePullFailed {
		t.Fatalf("Create: %v, want the same refusal", err)
	}
}

func TestValidateSocketPathLimit(t *testing.T) {
	root := filepath.Join(shortDir(t), strings.Repeat("r", 60))
	r := newTestRuntime(t, root, nil)
	s := runtime.Spec{ID: strings.Repeat("a", 40), Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}, Image: runtime.Image{URL: "file:///i", SHA256: strings.Repeat("a", 64)}}
	if err := r.validate(s); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "unix socket limit") {
		t.Fatalf("validate: %v, want the socket path limit", err)
	}
}

func TestSameSpecAndSecretsDigest(t *testing.T) {
	a := baseSpec()
	b := baseSpec()
	b.Secrets = map[string][]byte{"k": []byte("v")}
	if !sameSpec(a, b) {
		t.Error("secrets changed the persisted spec")
	}
	b.Resources.MemoryMiB++
	if sameSpec(a, b) {
		t.Error("different memory compared equal")
	}
	key, other := []byte("key-1"), []byte("key-2")
	if secretsDigest(key, nil) != "" {
		t.Error("no secrets should have an empty digest")
	}
	d1 := secretsDigest(key, map[string][]byte{"a": []byte("bc")})
	d2 := secretsDigest(key, map[string][]byte{"ab": []byte("c")})
	if d1 == d2 || d1 != secretsDigest(key, map[string][]byte{"a": []byte("bc")}) {
		t.Error("digest must be stable and unambiguous")
	}
	if d1 == secretsDigest(other, map[string][]byte{"a": []byte("bc")}) {
		t.Error("digest does not depend on the key")
	}
}

func TestNewOptions(t *testing.T) {
	root := shortDir(t)
	if _, err := New(context.Background(), Options{Root: root, Accel: "tcg"}); err == nil {
		t.Error("New without Images succeeded")
	}
	r := newTestRuntime(t, root, nil)
	if _, err := New(context.Background(), Options{Root: root, Images: r.opts.Images, Accel: "warp"}); err == nil {
		t.Error("New with an unknown accel succeeded")
	}
	if r.Name() != "qemu" || r.opts.OverlayDir != filepath.Join(root, "overlays") || r.opts.QEMUImg != "qemu-img" {
		t.Errorf("defaults: name %q overlay %q qemu-img %q", r.Name(), r.opts.OverlayDir, r.opts.QEMUImg)
	}
}
