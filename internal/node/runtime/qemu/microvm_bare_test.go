package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
)

// bareBoot boots the kit's kernel and initramfs on machine (q35 or
// microvm) under TCG with rootfs (snapshot=on: not written) and the config
// drive cfg, without the runtime. With serials the disks carry the virtio
// serials drover-init looks for (QEMU's way); without, they carry none and
// the kernel command line names them by position (guestinit.RootParam,
// ConfigParam: Firecracker's way). It returns the wall time to the init's
// first report on the serial console and the reports seen by then, or
// ok false after within.
func bareBoot(t testing.TB, kit microvmtest.Kit, machine, rootfs, cfg string, serials bool, within time.Duration) (time.Duration, []guestinit.Report, bool) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "bare-"+machine+".log")
	bus := map[string]string{"q35": "pci", "microvm": "device"}[machine]
	line := microvmCmdline("amd64", "tcg", hostTSCKHz("/proc/cpuinfo"))
	rootDev, cfgDev := "virtio-blk-"+bus+",drive=d0", "virtio-blk-"+bus+",drive=c0"
	if serials {
		rootDev += ",serial=" + guestinit.RootSerial
		cfgDev += ",serial=" + guestinit.ConfigSerial
	} else {
		line += " " + guestinit.RootParam + "=/dev/vda " + guestinit.ConfigParam + "=/dev/vdb"
	}
	cmd := exec.Command(kit.QEMU, "-machine", machine, "-accel", "tcg", "-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
		"-kernel", kit.Kernel, "-initrd", kit.Initrd, "-append", line,
		"-drive", "if=none,id=d0,file="+rootfs+",format=raw,snapshot=on", "-device", rootDev,
		"-drive", "if=none,id=c0,file="+cfg+",format=raw,readonly=on", "-device", cfgDev,
		"-netdev", "user,id=n0", "-device", "virtio-net-"+bus+",netdev=n0", "-serial", "file:"+log)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	for time.Since(t0) < within {
		b, _ := os.ReadFile(log)
		if reps := guestinit.ParseReports(b); len(reps) > 0 {
			return time.Since(t0), reps, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	b, _ := os.ReadFile(log)
	t.Logf("bare %s boot: no init report within %v; serial tail: %q", machine, within, tail(string(b), 2000))
	return 0, nil, false
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestRealMicroVMDisksByCmdline boots drover-init the way the Firecracker
// runtime does (firecracker.GuestBootArgs: the disks have no virtio
// serial, drover.root= and drover.config= name /dev/vda and /dev/vdb) on
// QEMU's microvm machine under TCG: the init finds both, switches to the
// root filesystem and starts the workload, whose exit it reports. This is
// the guest half of the Firecracker path; Firecracker itself is not run
// here (docs/runbooks/firecracker.md).
func TestRealMicroVMDisksByCmdline(t *testing.T) {
	kit := microvmtest.Build(t, "")
	dir := t.TempDir()
	rootfs := microvmtest.Rootfs(t, dir)
	drive, err := guestinit.EncodeConfig(guestinit.Config{Entrypoint: []string{"/bin/sh", "-c", "echo disks-by-cmdline; exit 7"},
		Network: &guestinit.UserNetwork})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.img")
	if err := os.WriteFile(cfg, drive, 0o600); err != nil {
		t.Fatal(err)
	}
	took, reps, ok := bareBoot(t, kit, "microvm", rootfs, cfg, false, 3*time.Minute)
	if !ok {
		t.Fatal("no init report: drover-init did not find its disks by the command line")
	}
	if reps[0].Event != guestinit.EventStarted {
		t.Fatalf("first report %+v, want %s", reps[0], guestinit.EventStarted)
	}
	t.Logf("init started the workload %v after QEMU started (guest uptime %d ms)", took.Round(time.Millisecond), reps[0].UptimeMS)
}
