//go:build linux

package firecracker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestValidateRefuses: what Firecracker cannot run is refused at Create
// with the field and a reason code.
func TestValidateRefuses(t *testing.T) {
	e := newTestEnv(t)
	r := e.runtime(t)
	cases := []struct {
		name   string
		mod    func(*runtime.Spec)
		reason api.ReasonCode
		want   string
	}{
		{"oci without a guest kernel", func(s *runtime.Spec) {
			s.Image = runtime.Image{Kind: runtime.ImageOCI, Ref: "nginx:1"}
			s.VM.Boot = nil
		},
			api.ReasonImagePullFailed, "NODE_AGENT_FIRECRACKER_KERNEL"},
		{"command on a disk image", func(s *runtime.Spec) { s.Command = []string{"/bin/sh"} }, api.ReasonFirecrackerStartFailed, "own init"},
		{"bridge without networking", func(s *runtime.Spec) { s.VM.Network = runtime.VMNetwork{Mode: api.NetworkBridge} }, api.ReasonNetworkSetupFailed, "mode bridge"},
		{"no kernel", func(s *runtime.Spec) { s.VM.Boot = nil }, api.ReasonImagePullFailed, "spec.vm.boot.kernel"},
		{"vcpus", func(s *runtime.Spec) { s.Resources.VCPUs = 33 }, api.ReasonFirecrackerStartFailed, "vcpus"},
		{"ports", func(s *runtime.Spec) { s.Ports = []api.PortForward{{Name: "http", GuestPort: 80}} }, api.ReasonNetworkSetupFailed, "spec.ports"},
		{"tcp readiness without tap", func(s *runtime.Spec) { s.Readiness.TCPPort = 80 }, api.ReasonFirecrackerStartFailed, "tcp_port"},
		{"secrets on a disk image", func(s *runtime.Spec) { s.Secrets = map[string][]byte{"k": []byte("v")} }, api.ReasonSecretsInjectionFailed, "spec.secrets"},
		{"bad mac", func(s *runtime.Spec) { s.VM.Network = runtime.VMNetwork{Mode: api.NetworkTap, MAC: "nope"} }, api.ReasonNetworkSetupFailed, "mac"},
		{"accel", func(s *runtime.Spec) { s.VM.Accel = "tcg" }, api.ReasonFirecrackerStartFailed, "kvm only"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := e.spec("v1")
			tc.mod(&s)
			_, err := r.Create(context.Background(), s)
			if !errors.Is(err, ErrInvalidSpec) || runtime.ReasonOf(err, "") != tc.reason || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Create = %v, want %s naming %q", err, tc.reason, tc.want)
			}
		})
	}
}

// TestTapMustExist: without a TapProvider, tap mode names TapName(id) and
// a missing device is network_setup_failed at Start.
func TestTapMustExist(t *testing.T) {
	e := newTestEnv(t)
	r := e.runtime(t)
	s := e.spec("tapless")
	s.VM.Network = runtime.VMNetwork{Mode: api.NetworkTap}
	ctx := context.Background()
	if _, err := r.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	_, err := r.Start(ctx, "tapless")
	if runtime.ReasonOf(err, "") != api.ReasonNetworkSetupFailed || !strings.Contains(err.Error(), TapName("tapless")) {
		t.Fatalf("Start = %v, want network_setup_failed naming %s", err, TapName("tapless"))
	}
	if n := TapName("x"); len(n) > 15 {
		t.Errorf("TapName %q is longer than IFNAMSIZ-1", n)
	}
}

// TestDetect: the runtime is offered only with a firecracker binary and the
// agent's KVM verdict.
func TestDetect(t *testing.T) {
	e := newTestEnv(t)
	if _, err := Detect(filepath.Join(e.files, "missing"), "kvm"); err == nil || !strings.Contains(err.Error(), "NODE_AGENT_FIRECRACKER_BINARY") {
		t.Errorf("Detect without a binary = %v", err)
	}
	if _, err := Detect(e.bin, "tcg"); err == nil || !strings.Contains(err.Error(), "KVM") {
		t.Errorf("Detect without KVM = %v", err)
	}
	if p, err := Detect(e.bin, "kvm"); err != nil || p != e.bin {
		t.Errorf("Detect = %q, %v", p, err)
	}
	t.Setenv("PATH", filepath.Dir(e.bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	if p, err := Detect("", "kvm"); err != nil || p != e.bin {
		t.Errorf("Detect on PATH = %q, %v", p, err)
	}
	o := runtime.Options{Root: shortDir(t), Accel: ""}
	if _, err := Factory(context.Background(), o, Config{Binary: e.bin}); err == nil {
		t.Error("Factory without KVM built a runtime")
	}
}

func TestConfig(t *testing.T) {
	entry := Entry()
	if err := entry.Check(runtime.Values{"JAILER_UID": "-1"}); err == nil || !strings.Contains(err.Error(), "NODE_AGENT_FIRECRACKER_JAILER_UID") {
		t.Errorf("Check(bad uid) = %v", err)
	}
	if _, err := ParseConfig(runtime.Values{"JAILER_UID": "0", "JAILER_GID": "0", "KERNEL": "/vmlinux"}); err == nil || !strings.Contains(err.Error(), "NODE_AGENT_FIRECRACKER_INITRD") {
		t.Errorf("ParseConfig(kernel without initrd) = %v", err)
	}
	c, err := ParseConfig(runtime.Values{"BINARY": "/usr/bin/firecracker", "JAILER": "jailer", "JAILER_UID": "123", "JAILER_GID": "456"})
	if err != nil || c.JailerUID != 123 || c.JailerGID != 456 || c.Jailer != "jailer" {
		t.Errorf("ParseConfig = %+v, %v", c, err)
	}
}

// TestJailer: the jailer's command line, its ids, and a Create that puts
// the rootfs inside the chroot (jailed Firecracker sees only the chroot;
// the paths it is given are chroot-relative).
func TestJailer(t *testing.T) {
	args := jailerArgs(JailerConfig{UID: 123, GID: 456, ChrootBase: "/srv/jailer"}, "/usr/bin/firecracker", "web-1")
	want := []string{"--id", "web-1", "--exec-file", "/usr/bin/firecracker", "--uid", "123", "--gid", "456",
		"--chroot-base-dir", "/srv/jailer", "--", "--api-sock", "/run/firecracker.socket"}
	if !slices.Equal(args, want) {
		t.Errorf("jailerArgs = %q\nwant %q", args, want)
	}
	if id := jailID("a_b"); strings.Contains(id, "_") || id == jailID("a-b") {
		t.Errorf("jailID(a_b) = %q", id)
	}
	e := newTestEnv(t)
	r := e.runtime(t, func(o *Options) { o.Jailer = &JailerConfig{Binary: "/bin/false", UID: os.Getuid(), GID: os.Getgid()} })
	st, err := r.Create(context.Background(), e.spec("jailed"))
	if err != nil {
		t.Fatal(err)
	}
	chroot := filepath.Join(r.opts.Jailer.ChrootBase, "firecracker", "jailed", "root")
	if st.Overlay != filepath.Join(chroot, rootfsName) {
		t.Errorf("jailed rootfs at %s, want inside %s", st.Overlay, chroot)
	}
	ps := persisted{Chroot: chroot}
	if g := guestPath(ps, filepath.Join(chroot, rootfsName)); g != "/"+rootfsName {
		t.Errorf("guestPath = %q", g)
	}
	if err := r.Destroy(context.Background(), "jailed"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(chroot)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail dir after Destroy: %v", err)
	}
}

// TestRootfsCopySparse: a copy keeps the image's bytes and size, grows to
// disk_gib, and leaves zero blocks as holes.
func TestRootfsCopySparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "base.ext4")
	data := make([]byte, 4<<20)
	copy(data, "superblock")
	copy(data[3<<20:], "late data")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "copy.ext4")
	if err := copyRootfs(src, dst, 8<<20); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil || len(got) != 8<<20 || string(got[:4<<20]) != string(data) {
		t.Fatalf("copy: %d bytes, %v", len(got), err)
	}
	if err := copyRootfs(src, filepath.Join(dir, "small.ext4"), 1<<20); err == nil {
		t.Error("copy smaller than the image succeeded")
	}
}
