package qemu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/node/volume"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestRealMicroVMVolumes boots microVMs under TCG (the kit and root
// filesystem of TestRealMicroVM) with named volumes: a writer appends to
// a raw volume and a qcow2 one, is restarted and appends again (a restart
// keeps the data); while it exists another instance cannot take the
// volume and the volume cannot be deleted; it is destroyed, and a new
// instance mounting the raw volume read-only reads both lines back and
// cannot write. A volume whose ext4 the guest cannot mount ends its
// instance as volume_attach_failed from drover-init's report; one that
// holds no filesystem at all is refused before QEMU. Delete then works.
func TestRealMicroVMVolumes(t *testing.T) {
	kit := microvmtest.Build(t, "")
	dir := t.TempDir()
	rootfs := microvmtest.Rootfs(t, dir)
	sum, err := qemutest.FileSHA256(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	root := shortDir(t)
	vols, err := volume.New(volume.Options{Dir: filepath.Join(root, "volumes"), QEMUImg: kit.QEMUImg})
	if err != nil {
		t.Fatal(err)
	}
	r := newTestRuntime(t, root, []string{dir}, func(o *Options) {
		o.QEMUBinary, o.QEMUImg = kit.QEMU, kit.QEMUImg
		o.MicroVM = &MicroVMOptions{Kernel: kit.Kernel, Initrd: kit.Initrd, Volumes: vols}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := r.Subscribe(ctx)
	spec := func(id, script string, v ...runtime.Volume) runtime.Spec {
		return runtime.Spec{ID: id, Owner: "test", Image: runtime.Image{URL: "file://" + rootfs, SHA256: sum},
			Command: []string{"/bin/sh", "-c", script}, Volumes: v,
			Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 256}, VM: &runtime.VMSpec{MicroVM: true}}
	}
	// run boots id until its workload exits and wants exit code 0.
	run := func(id string) runtime.Status {
		t.Helper()
		t0 := time.Now()
		if _, err := r.Start(ctx, id); err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		ev := waitExit(t, r, events, id)
		st, _ := r.Inspect(ctx, id)
		if ev.State != runtime.StateStopped || ev.Detail != "workload exited with code 0" {
			t.Fatalf("%s: %s %q %q\n%s", id, ev.State, ev.Reason, ev.Detail, serialLog(t, st))
		}
		t.Logf("%s: boot to workload exit in %v", id, time.Since(t0).Round(time.Millisecond))
		return st
	}
	data := runtime.Volume{Source: "data", Target: "/data", SizeGiB: 1}
	cache := runtime.Volume{Source: "cache", Target: "/var/cache/app", Format: api.VolumeFormatQCOW2}

	// The writer: one line more in each volume per boot; it prints how
	// many the raw one has.
	const write = `echo kept >> /data/f && echo cached >> /var/cache/app/c && n=0 && while read l; do n=$((n+1)); done < /data/f && echo "data lines: $n"`
	if _, err := r.Create(ctx, spec("mvw", write, data, cache)); err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, r, "mvw")
	st := run("mvw")
	if log := serialLog(t, st); !strings.Contains(log, "data lines: 1") {
		t.Fatalf("first boot:\n%s", log)
	}
	st = run("mvw") // a restart
	if log := serialLog(t, st); !strings.Contains(log, "data lines: 2") {
		t.Fatalf("the restart lost the volume's data:\n%s", log)
	}

	// While mvw exists (stopped), the volume is its own.
	_, err = r.Create(ctx, spec("mvx", "true", data))
	if runtime.ReasonOf(err, "") != api.ReasonVolumeAttachFailed || !strings.Contains(err.Error(), "held by instance mvw") {
		t.Fatalf("a second instance on mvw's volume: %v", err)
	}
	if _, err := r.DeleteVolume(ctx, "data"); !errors.Is(err, runtime.ErrVolumeInUse) || !strings.Contains(err.Error(), "mvw") {
		t.Fatalf("delete while attached: %v", err)
	}

	// Recreated: a new instance reads what mvw wrote, read-only.
	if err := r.Destroy(ctx, "mvw"); err != nil {
		t.Fatal(err)
	}
	ro := data
	ro.ReadOnly = true
	const read = `test "$(cat /data/f)" = "$(printf 'kept\nkept')" || exit 11
if echo x > /data/g; then exit 12; fi
test "$(cat /var/cache/app/c)" = "$(printf 'cached\ncached')" || exit 13`
	if _, err := r.Create(ctx, spec("mvr", read, ro, cache)); err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, r, "mvr")
	if _, args, err := r.CommandLine(ctx, "mvr"); err != nil || !strings.Contains(strings.Join(args, " "), "format=raw,readonly=on") {
		t.Errorf("read-only drive: %v %v", args, err)
	}
	run("mvr")
	if err := r.Destroy(ctx, "mvr"); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("debugfs"); err == nil { // the host sees the same file
		v, _, _ := vols.Get("data")
		out, err := exec.Command("debugfs", "-R", "cat /f", v.Path).Output()
		if err != nil || string(out) != "kept\nkept\n" {
			t.Errorf("debugfs cat /f: %q %v", out, err)
		}
	}

	// A volume with an ext4 superblock magic and nothing else: the host's
	// check passes, the guest's mount fails, drover-init reports it.
	bad, err := vols.Ensure(ctx, "bad", 1, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(bad.Path, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(bad.Path, 1<<30); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(bad.Path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte{0x53, 0xef}, 1080)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, spec("mvb", "true", runtime.Volume{Source: "bad", Target: "/bad"})); err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, r, "mvb")
	if _, err := r.Start(ctx, "mvb"); err != nil {
		t.Fatal(err)
	}
	ev := waitExit(t, r, events, "mvb")
	if ev.State != runtime.StateCrashed || ev.Reason != api.ReasonVolumeAttachFailed || !strings.Contains(ev.Detail, "drover-init: volume /bad: mount") {
		st, _ := r.Inspect(ctx, "mvb")
		t.Errorf("unmountable volume: %s %q %q\n%s", ev.State, ev.Reason, ev.Detail, serialLog(t, st))
	}
	// No filesystem at all: refused on the host, before QEMU.
	if err := os.Truncate(bad.Path, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(bad.Path, 1<<30); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, "mvb"); runtime.ReasonOf(err, "") != api.ReasonVolumeAttachFailed || !strings.Contains(err.Error(), "no ext4 filesystem") {
		t.Errorf("start on a volume with no filesystem: %v", err)
	}

	// Nothing holds data now: it goes on an explicit delete only.
	v, _, _ := vols.Get("data")
	if existed, err := r.DeleteVolume(ctx, "data"); err != nil || !existed {
		t.Fatalf("delete: %v %v", existed, err)
	}
	if _, err := os.Stat(v.Path); !os.IsNotExist(err) {
		t.Errorf("volume file after delete: %v", err)
	}
}
