package qemu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/node/volume"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestMicroVMVolumeCommandLine: each volume is a drive of its own format
// (never probed) and a virtio disk on the machine's bus with its serial;
// a read-only one is readonly=on.
func TestMicroVMVolumeCommandLine(t *testing.T) {
	spec := runtime.Spec{ID: "m1", Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}, VM: &runtime.VMSpec{MicroVM: true}}
	l := Launch{Arch: "amd64", Accel: "kvm", Disk: "/o.qcow2", DiskFormat: "qcow2", Seed: "/c.img", Kernel: "/k", Initrd: "/i",
		SerialSocket: "/s", SerialLog: "/l", QMPSocket: "/q", PIDFile: "/p",
		Volumes: []VolumeDrive{{Name: "pgdata", Path: "/v/pgdata.ext4", Format: "raw", Serial: volumeSerial(0)},
			{Name: "seed", Path: "/v/a,b.qcow2", Format: "qcow2", Serial: volumeSerial(1), ReadOnly: true}}}
	line := strings.Join(CommandLine(spec, l), " ")
	for _, want := range []string{
		"-drive if=none,id=vol0,file=/v/pgdata.ext4,format=raw -device virtio-blk-device,drive=vol0,serial=drover-vol0",
		"-drive if=none,id=vol1,file=/v/a,,b.qcow2,format=qcow2,readonly=on -device virtio-blk-device,drive=vol1,serial=drover-vol1",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("%q not in %s", want, line)
		}
	}
	l.Accel = "tcg" // q35: virtio-pci
	if line = strings.Join(CommandLine(spec, l), " "); !strings.Contains(line, "virtio-blk-pci,drive=vol1,serial=drover-vol1") {
		t.Errorf("tcg: %s", line)
	}
	if s := volumeSerial(api.MaxMicroVMVolumes - 1); len(s) > 20 {
		t.Errorf("serial %q is over virtio-blk's 20 bytes", s)
	}
	// The persisted state carries them into Launch.
	r := newTestRuntime(t, shortDir(t), nil)
	if got := r.launchFor(&instance{id: "m1", spec: spec}, persisted{Volumes: l.Volumes}, nil, "").Volumes; !slices.Equal(got, l.Volumes) {
		t.Errorf("launchFor volumes %+v", got)
	}
}

// TestMicroVMVolumeValidate: the runtime refuses what the control plane
// refuses (a second line of defence for specs from elsewhere), each
// error naming its field, and volumes on an agent that keeps none.
func TestMicroVMVolumeValidate(t *testing.T) {
	r := newTestRuntime(t, shortDir(t), nil)
	r.opts.MicroVM = &MicroVMOptions{Kernel: "/k", Initrd: "/i"}
	ok := runtime.Spec{ID: "m1", Image: runtime.Image{URL: "file:///r.ext4", SHA256: strings.Repeat("a", 64)},
		Command: []string{"/srv"}, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}, VM: &runtime.VMSpec{MicroVM: true},
		Volumes: []runtime.Volume{{Source: "pgdata", Target: "/var/lib/pg", SizeGiB: 10}, {Source: "c", Target: "/c", Format: "qcow2", ReadOnly: true}}}
	if err := r.validate(ok); err == nil || runtime.ReasonOf(err, "") != api.ReasonVolumeAttachFailed || !strings.Contains(err.Error(), "keeps no microVM volumes") {
		t.Errorf("volumes without a manager: %v", err)
	}
	m, err := volume.New(volume.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	r.opts.MicroVM.Volumes = m
	if err := r.validate(ok); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		vols []runtime.Volume
		want string
	}{
		{"host path", []runtime.Volume{{Source: "/srv", Target: "/d"}}, "spec.volumes[0].source"},
		{"dots", []runtime.Volume{{Source: "a..b", Target: "/d"}}, "spec.volumes[0].source"},
		{"twice", []runtime.Volume{{Source: "a", Target: "/d"}, {Source: "a", Target: "/e"}}, "spec.volumes[1].source"},
		{"relative", []runtime.Volume{{Source: "a", Target: "d"}}, "spec.volumes[0].target"},
		{"root", []runtime.Volume{{Source: "a", Target: "/"}}, "spec.volumes[0].target"},
		{"unclean", []runtime.Volume{{Source: "a", Target: "/d/../e"}}, "spec.volumes[0].target"},
		{"sys", []runtime.Volume{{Source: "a", Target: "/sys"}}, "spec.volumes[0].target"},
		{"same target", []runtime.Volume{{Source: "a", Target: "/d"}, {Source: "b", Target: "/d"}}, "spec.volumes[1].target"},
		{"size", []runtime.Volume{{Source: "a", Target: "/d", SizeGiB: -1}}, "spec.volumes[0].size_gib"},
		{"format", []runtime.Volume{{Source: "a", Target: "/d", Format: "vhdx"}}, "spec.volumes[0].format"},
		{"too many", make([]runtime.Volume, api.MaxMicroVMVolumes+1), "spec.volumes:"},
	} {
		s := ok
		s.Volumes = tc.vols
		err := r.validate(s)
		if runtime.ReasonOf(err, "") != api.ReasonVolumeAttachFailed || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want volume_attach_failed naming %s", tc.name, err, tc.want)
		}
	}
}

// TestMicroVMVolumeVerdict: drover-init failing to mount a volume ends the
// instance as volume_attach_failed; its other failures stay
// vm_start_failed.
func TestMicroVMVolumeVerdict(t *testing.T) {
	dir := t.TempDir()
	in := &instance{id: "m1", dir: dir}
	r := &Runtime{}
	for _, tc := range []struct {
		err    string
		reason api.ReasonCode
	}{
		{guestinit.VolumeErrorPrefix + "/data: mount /dev/vdc: invalid argument", api.ReasonVolumeAttachFailed},
		{guestinit.VolumeErrorPrefix + "/data: disks drover-vol0 not found", api.ReasonVolumeAttachFailed},
		{"config drive: bad length", api.ReasonVMStartFailed},
	} {
		rep := guestinit.Report{Event: guestinit.EventFailed, ExitCode: 127, Error: tc.err}
		if err := os.WriteFile(filepath.Join(dir, serialLogName), []byte("noise\r\n"+rep.Line()), 0o600); err != nil {
			t.Fatal(err)
		}
		st, reason, detail := r.microvmVerdict(in, false, runtime.StateStopped, "", "")
		if st != runtime.StateCrashed || reason != tc.reason || detail != "drover-init: "+tc.err {
			t.Errorf("%q: %s %q %q", tc.err, st, reason, detail)
		}
	}
}

// TestMicroVMVolumesHeldAndRecovered (no boot: Create only, with real
// mkfs.ext4 and qemu-img): a volume is attached to the instance Create
// made, a second instance asking for it is volume_attach_failed naming
// the holder and leaves nothing behind, delete is refused while it is
// held; an agent that crashes with a half-made Create holding a volume
// leaks no holder once a new agent Recovers, and a live instance keeps
// its own through the restart; Destroy detaches without deleting.
func TestMicroVMVolumesHeldAndRecovered(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s: %v", tool, err)
			}
			t.Skipf("%s: %v", tool, err)
		}
	}
	ctx := context.Background()
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", rootfs, "8M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	sum, err := qemutest.FileSHA256(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	root := shortDir(t)
	newRuntime := func() (*Runtime, *volume.Manager) {
		m, err := volume.New(volume.Options{Dir: filepath.Join(root, "volumes")})
		if err != nil {
			t.Fatal(err)
		}
		return newTestRuntime(t, root, []string{dir}, func(o *Options) {
			o.MicroVM = &MicroVMOptions{Kernel: "/nonexistent/vmlinuz", Initrd: "/nonexistent/initrd", Volumes: m}
		}), m
	}
	r, m := newRuntime()
	spec := func(id string, vols ...runtime.Volume) runtime.Spec {
		return runtime.Spec{ID: id, Image: runtime.Image{URL: "file://" + rootfs, SHA256: sum}, Command: []string{"/srv"},
			Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}, VM: &runtime.VMSpec{MicroVM: true}, Volumes: vols}
	}
	holders := func(name string) []string {
		t.Helper()
		v, ok, err := m.Get(name)
		if err != nil || !ok {
			t.Fatalf("volume %s: %v %v", name, ok, err)
		}
		return v.Holders
	}

	if _, err := r.Create(ctx, spec("a", runtime.Volume{Source: "data", Target: "/data", SizeGiB: 2},
		runtime.Volume{Source: "cache", Target: "/cache", Format: "qcow2"})); err != nil {
		t.Fatal(err)
	}
	if h := holders("data"); !slices.Equal(h, []string{"a"}) {
		t.Fatalf("holders %v", h)
	}
	if v, _, _ := m.Get("data"); v.SizeGiB != 2 || v.Format != volume.FormatRaw {
		t.Errorf("data %+v", v)
	}
	if v, _, _ := m.Get("cache"); v.SizeGiB != api.DefaultVolumeSizeGiB || v.Format != volume.FormatQCOW2 {
		t.Errorf("cache %+v", v)
	}
	// The config drive tells the init where to mount them.
	f, err := os.Open(filepath.Join(r.instDir, "a", configDriveName))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := guestinit.DecodeConfig(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := []guestinit.Volume{{Serial: "drover-vol0", Target: "/data"}, {Serial: "drover-vol1", Target: "/cache"}}; !slices.Equal(cfg.Volumes, want) {
		t.Errorf("config drive volumes %+v", cfg.Volumes)
	}

	// Held by a: b is refused, naming a, and leaves nothing behind (not
	// even a hold on cache, which it got first).
	_, err = r.Create(ctx, spec("b", runtime.Volume{Source: "spare", Target: "/spare"}, runtime.Volume{Source: "data", Target: "/data"}))
	if runtime.ReasonOf(err, "") != api.ReasonVolumeAttachFailed || !errors.Is(err, runtime.ErrVolumeInUse) || !strings.Contains(err.Error(), "held by instance a") {
		t.Fatalf("second holder: %v", err)
	}
	if h := holders("spare"); len(h) != 0 {
		t.Errorf("spare still held by %v after b's failed create", h)
	}
	if _, err := os.Stat(filepath.Join(r.instDir, "b")); !os.IsNotExist(err) {
		t.Errorf("b's directory: %v", err)
	}
	if _, err := r.DeleteVolume(ctx, "data"); !errors.Is(err, runtime.ErrVolumeInUse) {
		t.Errorf("delete while held: %v", err)
	}
	// A larger size than the volume has is not a grow.
	if _, err := r.Create(ctx, spec("g", runtime.Volume{Source: "cache", Target: "/c", SizeGiB: 5})); runtime.ReasonOf(err, "") != api.ReasonVolumeAttachFailed {
		t.Errorf("grow: %v", err)
	}

	// An agent crash in the middle of c's Create, after the attach and
	// before spec.json: a half-made instance holding spare.
	if _, err := r.Create(ctx, spec("c", runtime.Volume{Source: "spare", Target: "/spare"})); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(r.instDir, "c", specFile)); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r, m = newRuntime()
	if _, err := r.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if h := holders("spare"); len(h) != 0 {
		t.Errorf("spare held by %v after Recover removed the half-made c", h)
	}
	if h := holders("data"); !slices.Equal(h, []string{"a"}) {
		t.Errorf("a lost its hold across the restart: %v", h)
	}
	list, err := r.ListVolumes(ctx)
	if err != nil || len(list) != 3 {
		t.Fatalf("list %+v %v", list, err)
	}

	// Destroy detaches; the data stays until an explicit delete.
	if err := r.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if h := holders("data"); len(h) != 0 {
		t.Errorf("data held by %v after destroy", h)
	}
	v, _, _ := m.Get("data")
	if _, err := os.Stat(v.Path); err != nil {
		t.Fatalf("destroy removed the volume: %v", err)
	}
	if existed, err := r.DeleteVolume(ctx, "data"); err != nil || !existed {
		t.Fatalf("delete: %v %v", existed, err)
	}
	if _, err := os.Stat(v.Path); !os.IsNotExist(err) {
		t.Errorf("volume file after delete: %v", err)
	}
	if existed, err := r.DeleteVolume(ctx, "data"); err != nil || existed {
		t.Errorf("delete again: %v %v", existed, err)
	}
}
