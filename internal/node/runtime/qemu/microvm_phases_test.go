package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
	"github.com/drover-dev/drover/internal/node/oci"
	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// BenchmarkMicroVMBootPhases logs the boot-time breakdown of
// docs/performance.md (-bench BenchmarkMicroVMBootPhases -benchtime 1x; it
// takes a minute or two under TCG): pull, rootfs build, cached rootfs, then per machine (q35,
// microvm) Create on the cached rootfs, the guest's uptime when the init
// started the workload, Start → Ready by HTTP, and a bare QEMU boot of the
// same kernel, initramfs and disks (no runtime, -serial file) to the
// init's started report.
func BenchmarkMicroVMBootPhases(b *testing.B) {
	var t testing.TB = b // one measured boot per run (-benchtime 1x); a timing, not a test
	ctx := context.Background()
	kit := microvmtest.Build(t, "")
	reg := ocitest.StartRegistry()
	defer reg.Close()
	server, err := ocitest.BuildTestServer(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := reg.Push("drover/web", "v1", server, "PORT=8080")
	if err != nil {
		t.Fatal(err)
	}
	root := shortDir(t)
	store, err := oci.New(oci.Options{Dir: filepath.Join(root, "oci"), AllowLocalURLs: true, Log: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	im, err := store.Pull(ctx, img.Ref, img.Digest, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pull := time.Since(t0)
	t0 = time.Now()
	rfs, err := store.Rootfs(ctx, im.Digest, nil)
	if err != nil {
		t.Fatal(err)
	}
	build := time.Since(t0)
	t0 = time.Now()
	if _, _, err := store.Prepare(ctx, "warm", img.Ref, img.Digest, nil, nil); err != nil {
		t.Fatal(err)
	}
	cached := time.Since(t0)
	_ = store.Release("warm")
	t.Logf("PHASE pull %v (layers %d), rootfs build %v (%d MiB), cached pull+rootfs %v",
		pull.Round(time.Millisecond), len(im.Layers), build.Round(time.Millisecond), rfs.Bytes>>20, cached.Round(time.Millisecond))

	drive, err := guestinit.EncodeConfig(guestinit.Config{Entrypoint: im.Config.Cmd, Env: im.Config.Env, Network: &guestinit.UserNetwork})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(root, "config.img")
	if err := os.WriteFile(cfgPath, drive, 0o600); err != nil {
		t.Fatal(err)
	}
	r := newTestRuntime(t, root, nil, func(o *Options) {
		o.QEMUBinary, o.QEMUImg = kit.QEMU, kit.QEMUImg
		o.MicroVM = &MicroVMOptions{Kernel: kit.Kernel, Initrd: kit.Initrd, OCI: store}
	})
	for _, machine := range []string{"q35", "microvm"} {
		r.opts.MicroVM.Machine = machine
		id := "ph" + machine
		spec := runtime.Spec{ID: id, Image: runtime.Image{Kind: runtime.ImageOCI, Ref: img.Ref, Digest: img.Digest},
			Ports:     []api.PortForward{{Name: "http", GuestPort: 8080}},
			Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 256},
			Readiness: runtime.Readiness{Readiness: api.Readiness{TCPPort: 8080, HTTPPath: "/health"}},
			VM:        &runtime.VMSpec{MicroVM: true}}
		t0 = time.Now()
		if _, err := r.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		create := time.Since(t0)
		destroyAtEnd(t, r, id)
		t0 = time.Now()
		if _, err := r.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
		st, _ := r.Inspect(ctx, id)
		var toInit time.Duration
		for !st.Ready && st.State == runtime.StateRunning && time.Since(t0) < 90*time.Second {
			time.Sleep(10 * time.Millisecond)
			if _, ok := lastReport(st.SerialLog, 0); ok && toInit == 0 {
				toInit = time.Since(t0)
			}
			st, _ = r.Inspect(ctx, id)
		}
		ready := time.Since(t0)
		rep, _ := lastReport(st.SerialLog, 0)
		if !st.Ready {
			t.Logf("PHASE %s: not Ready after %v (serial: %q)", machine, ready, serialLog(t, st))
		} else {
			t.Logf("PHASE %s: create (overlay + config drive, cached rootfs) %v; start → init's started report %v (guest uptime %d ms); → Ready by HTTP %v",
				machine, create.Round(time.Millisecond), toInit.Round(time.Millisecond), rep.UptimeMS, ready.Round(time.Millisecond))
		}
		if _, err := r.Stop(ctx, id, 10*time.Second); err != nil {
			t.Error(err)
		}

		// The same boot without the runtime.
		bare, rep2, ok := bareBoot(t, kit, machine, rfs.Path, cfgPath, true, 90*time.Second)
		if !ok {
			t.Logf("PHASE bare %s: no init report within 90s", machine)
			continue
		}
		t.Logf("PHASE bare qemu -M %s to the init's started report: %v (guest uptime %d ms)", machine, bare.Round(time.Millisecond), rep2[0].UptimeMS)
	}
}
