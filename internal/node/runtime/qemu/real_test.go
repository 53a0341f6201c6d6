package qemu

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// These tests boot the qemutest guest under TCG (~5 s a boot here).
// readyTimeout is a bound, not a target: under CI, the integration
// package's TCG guests and this package's share two cores, and a boot
// took over a minute once while other work loaded the machine (load
// average 12).
const readyTimeout = 3 * time.Minute

type realEnv struct {
	g    qemutest.Guest
	root string
}

func newRealEnv(t *testing.T) realEnv {
	t.Helper()
	g := qemutest.Build(t, "")
	return realEnv{g: g, root: shortDir(t)}
}

// runtime returns a new Runtime over the env's root.
func (e realEnv) runtime(t *testing.T, mods ...func(*Options)) *Runtime {
	t.Helper()
	mods = append([]func(*Options){func(o *Options) { o.QEMUBinary, o.QEMUImg = e.g.QEMU, e.g.QEMUImg }}, mods...)
	return newTestRuntime(t, e.root, []string{filepath.Dir(e.g.Initrd), filepath.Dir(e.g.Kernel)}, mods...)
}

// spec boots the guest with extra kernel command-line knobs.
func (e realEnv) spec(id string, knobs ...string) runtime.Spec {
	return runtime.Spec{
		ID: id, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 256}, Owner: "test",
		Image: runtime.Image{URL: "file://" + e.g.Disk, SHA256: e.g.DiskSHA256},
		VM: &runtime.VMSpec{Boot: &api.DirectBoot{
			Kernel:  api.Artifact{URL: "file://" + e.g.Kernel, SHA256: e.g.KernelSHA256},
			Initrd:  &api.Artifact{URL: "file://" + e.g.Initrd, SHA256: e.g.InitrdSHA256},
			Cmdline: strings.TrimSpace(e.g.Cmdline + " " + strings.Join(knobs, " ")),
		}},
		Readiness: runtime.Readiness{Readiness: api.Readiness{SerialMarker: e.g.Marker}},
	}
}

// destroyAtEnd destroys id with r when the test ends.
func destroyAtEnd(t testing.TB, r *Runtime, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := r.Destroy(ctx, id); err != nil {
			t.Errorf("cleanup: destroy %s: %v", id, err)
		}
	})
}

// waitEvent waits for an event of kind for id.
func waitEvent(t *testing.T, ch <-chan runtime.Event, id string, kind runtime.EventKind, d time.Duration) runtime.Event {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event channel closed while waiting for %s", kind)
			}
			if ev.ID == id && ev.Kind == kind {
				return ev
			}
			if ev.ID == id && ev.Kind == runtime.EventExited && kind != runtime.EventExited {
				t.Fatalf("instance exited (%s: %s) while waiting for %s", ev.State, ev.Detail, kind)
			}
		case <-deadline:
			t.Fatalf("no %s event for %s within %v", kind, id, d)
		}
	}
}

// waitReadyStatus polls Inspect until Ready.
func waitReadyStatus(t *testing.T, r *Runtime, id string, d time.Duration) runtime.Status {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, err := r.Inspect(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready {
			return st
		}
		if st.State != runtime.StateRunning || time.Now().After(deadline) {
			t.Fatalf("not ready: state %s (%s) after %v", st.State, st.ExitDetail, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// countQEMU counts live processes whose command line has qmpPath (Linux).
func countQEMU(t *testing.T, r *Runtime, qmpPath string) int {
	t.Helper()
	if goruntime.GOOS != "linux" {
		t.Skip("counting QEMUs by their command line needs /proc")
	}
	n := 0
	for _, pid := range scanQEMU(r.instDir)[qmpPath] {
		if processAlive(pid, qmpPath) {
			n++
		}
	}
	return n
}

func serialLog(t testing.TB, st runtime.Status) string {
	b, _ := os.ReadFile(st.SerialLog)
	return string(b)
}

func TestRealLifecycleAndRecover(t *testing.T) {
	e := newRealEnv(t)
	ctx := context.Background()
	r := e.runtime(t)
	const id = "life"
	destroyAtEnd(t, r, id)
	events := r.Subscribe(ctx)

	st, err := r.Create(ctx, e.spec(id))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != runtime.StateCreated || st.Overlay == "" {
		t.Fatalf("created: %+v", st)
	}
	if _, err := os.Stat(st.Overlay); err != nil {
		t.Fatalf("overlay: %v", err)
	}
	if _, err := r.Create(ctx, e.spec(id)); err != nil {
		t.Fatalf("Create again with the same spec: %v", err)
	}
	other := e.spec(id)
	other.Resources.VCPUs = 2
	if _, err := r.Create(ctx, other); !errors.Is(err, runtime.ErrExists) {
		t.Fatalf("Create with another spec: %v, want ErrExists", err)
	}

	t0 := time.Now()
	st, err = r.Start(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Start returned after %v (pid %d)", time.Since(t0), st.PID)
	if st.State != runtime.StateRunning || st.PID == 0 || st.Accel != "tcg" || st.StartedAt.IsZero() {
		t.Fatalf("started: %+v", st)
	}
	waitEvent(t, events, id, runtime.EventStarted, time.Second)
	waitEvent(t, events, id, runtime.EventReady, readyTimeout)
	t.Logf("ready after %v", time.Since(t0))
	if err := r.Probe(ctx, id); err != nil {
		t.Errorf("Probe: %v", err)
	}
	if _, err := os.Stat(st.SerialSocket); err != nil {
		t.Errorf("serial socket: %v", err)
	}
	qmpPath := filepath.Join(r.instDir, id, qmpSock)
	if n := countQEMU(t, r, qmpPath); n != 1 {
		t.Fatalf("%d qemu processes for the instance, want 1", n)
	}

	// An agent restart: the old Runtime lets go, a new one adopts.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r2 := e.runtime(t)
	destroyAtEnd(t, r2, id)
	events2 := r2.Subscribe(ctx)
	list, err := r2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != id || !list[0].Adopted || list[0].PID != st.PID || list[0].State != runtime.StateRunning || list[0].Owner != "test" {
		t.Fatalf("recovered %+v, want %s adopted with pid %d", list, id, st.PID)
	}
	if rs := waitReadyStatus(t, r2, id, 5*time.Second); rs.PID != st.PID || !rs.Adopted {
		t.Errorf("after recover: %+v", rs)
	}
	if n := countQEMU(t, r2, qmpPath); n != 1 {
		t.Errorf("%d qemu processes after recover, want 1", n)
	}
	if st2, err := r2.Start(ctx, id); err != nil || st2.PID != st.PID {
		t.Errorf("Start of the adopted instance = pid %d, %v; want a no-op on pid %d", st2.PID, err, st.PID)
	}
	if err := r2.Probe(ctx, id); err != nil {
		t.Errorf("Probe after recover: %v", err)
	}

	res, err := r2.Stop(ctx, id, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("graceful stop took %v", res.Took)
	if res.HardStopped {
		t.Error("graceful stop reported HardStopped")
	}
	if processAlive(st.PID, qmpPath) {
		t.Error("qemu still alive after Stop returned")
	}
	ev := waitEvent(t, events2, id, runtime.EventExited, 5*time.Second)
	if ev.State != runtime.StateStopped {
		t.Errorf("exit event %+v, want stopped", ev)
	}
	st, _ = r2.Inspect(ctx, id)
	if st.State != runtime.StateStopped || st.Ready || st.PID != 0 || st.ExitedAt.IsZero() {
		t.Errorf("after stop: %+v", st)
	}
	if log := serialLog(t, st); !strings.Contains(log, qemutest.PoweroffMarker) {
		t.Errorf("guest did not print %q (graceful poweroff); serial:\n%s", qemutest.PoweroffMarker, log)
	}
	if res, err := r2.Stop(ctx, id, time.Second); err != nil || res.HardStopped {
		t.Errorf("second Stop = %+v, %v; want a no-op", res, err)
	}

	if err := r2.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{st.Overlay, filepath.Join(r2.instDir, id)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survives Destroy: %v", p, err)
		}
	}
	if n := countQEMU(t, r2, qmpPath); n != 0 {
		t.Errorf("%d qemu processes after Destroy", n)
	}
	if _, err := r2.Inspect(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Inspect after Destroy: %v", err)
	}
}

func TestRealHardStopAndKill(t *testing.T) {
	e := newRealEnv(t)
	ctx := context.Background()
	r := e.runtime(t)
	const id = "hard"
	destroyAtEnd(t, r, id)
	events := r.Subscribe(ctx)
	if _, err := r.Create(ctx, e.spec(id, qemutest.KnobNoButton)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, id, runtime.EventReady, readyTimeout)
	const graceful = 2 * time.Second
	res, err := r.Stop(ctx, id, graceful)
	if err != nil {
		t.Fatal(err)
	}
	if !res.HardStopped || res.Took < graceful {
		t.Errorf("stop of a guest ignoring the power button = %+v, want HardStopped after ≥ %v", res, graceful)
	}
	if ev := waitEvent(t, events, id, runtime.EventExited, 5*time.Second); ev.State != runtime.StateStopped {
		t.Errorf("exit %+v, want stopped", ev)
	}

	// Restart the stopped instance, then kill QEMU behind the runtime's back.
	st, err := r.Start(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, id, runtime.EventStarted, time.Second)
	proc, err := os.FindProcess(st.PID)
	if err == nil {
		err = proc.Kill() // SIGKILL
	}
	if err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, events, id, runtime.EventExited, 10*time.Second)
	if ev.State != runtime.StateCrashed || ev.Detail == "" {
		t.Errorf("exit after SIGKILL %+v, want crashed with a detail", ev)
	}
	if st, _ := r.Inspect(ctx, id); st.State != runtime.StateCrashed || st.ExitDetail == "" {
		t.Errorf("after kill: %+v", st)
	}
	if err := r.Probe(ctx, id); err == nil {
		t.Error("Probe of a crashed instance returned nil")
	}
}

func TestRealGuestPanic(t *testing.T) {
	e := newRealEnv(t)
	if !e.g.CanPanic {
		t.Skip("test kernel has no pvpanic modules")
	}
	ctx := context.Background()
	r := e.runtime(t)
	const id = "panic"
	destroyAtEnd(t, r, id)
	events := r.Subscribe(ctx)
	if _, err := r.Create(ctx, e.spec(id, qemutest.KnobCrash)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, events, id, runtime.EventExited, readyTimeout)
	if ev.State != runtime.StateCrashed || !strings.Contains(ev.Detail, "panic") {
		t.Errorf("exit %+v, want crashed by a guest panic", ev)
	}
}

func TestRealTCPReadiness(t *testing.T) {
	e := newRealEnv(t)
	if !e.g.CanNetwork {
		t.Skip("test kernel has no virtio-net modules")
	}
	ctx := context.Background()
	r := e.runtime(t)
	const id = "tcp"
	destroyAtEnd(t, r, id)
	events := r.Subscribe(ctx)
	// The guest prints its marker, then waits 2 s before it listens: Ready
	// must wait for the listener, not for QEMU's host-side socket.
	spec := e.spec(id, qemutest.KnobListen+"=8080", qemutest.KnobListenDelay+"=2")
	spec.Readiness = runtime.Readiness{Readiness: api.Readiness{TCPPort: 8080}}
	spec.Ports = []api.PortForward{{Name: "http", GuestPort: 8080}}
	if _, err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	st, err := r.Start(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ports["http"] == 0 {
		t.Fatalf("no host port chosen: %+v", st.Ports)
	}
	waitEvent(t, events, id, runtime.EventReady, readyTimeout)
	st, _ = r.Inspect(ctx, id)
	if log := serialLog(t, st); !strings.Contains(log, qemutest.ListeningMarker) {
		t.Fatalf("Ready before the guest listened; serial:\n%s", log)
	}
	if err := r.Probe(ctx, id); err != nil {
		t.Errorf("Probe: %v", err)
	}
	// The chosen port is persisted: a new Runtime reports it.
	_ = r.Close()
	r2 := e.runtime(t)
	destroyAtEnd(t, r2, id)
	if _, err := r2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	st2 := waitReadyStatus(t, r2, id, 10*time.Second)
	if st2.Ports["http"] != st.Ports["http"] {
		t.Errorf("recovered ports %v, want %v", st2.Ports, st.Ports)
	}
}

func TestRealCreateFailures(t *testing.T) {
	e := newRealEnv(t)
	ctx := context.Background()
	r := e.runtime(t)

	t.Run("bad image digest", func(t *testing.T) {
		s := e.spec("baddigest")
		s.Image.SHA256 = strings.Repeat("0", 64)
		_, err := r.Create(ctx, s)
		if got := runtime.ReasonOf(err, ""); got != api.ReasonImagePullFailed {
			t.Fatalf("Create: %v (reason %q), want image_pull_failed", err, got)
		}
		for _, p := range []string{filepath.Join(r.instDir, "baddigest"), filepath.Join(r.overlayDir, "baddigest.qcow2")} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s left behind by a failed Create", p)
			}
		}
		if _, err := r.Inspect(ctx, "baddigest"); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Inspect: %v, want ErrNotFound", err)
		}
	})
	t.Run("image outside the allowed dirs", func(t *testing.T) {
		s := e.spec("notallowed")
		s.Image.URL = "file:///etc/hostname"
		if _, err := r.Create(ctx, s); runtime.ReasonOf(err, "") != api.ReasonImagePullFailed {
			t.Fatalf("Create: %v, want image_pull_failed", err)
		}
	})
	t.Run("secrets without cloud-init", func(t *testing.T) {
		s := e.spec("secrets")
		s.Secrets = map[string][]byte{"token": []byte("x")}
		if _, err := r.Create(ctx, s); runtime.ReasonOf(err, "") != api.ReasonSecretsInjectionFailed {
			t.Fatalf("Create: %v, want secrets_injection_failed", err)
		}
	})
	t.Run("cloud-init seed with secrets", func(t *testing.T) {
		const id = "seeded"
		destroyAtEnd(t, r, id)
		s := e.spec(id)
		s.VM.CloudInit = &api.CloudInit{User: "ops"}
		s.Secrets = map[string][]byte{"token": []byte("s3cr3t-value")}
		st, err := r.Create(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(r.instDir, id)
		iso := seedBytes(t, r, id)
		if !strings.Contains(string(iso), "cidata") && !strings.Contains(string(iso), "CIDATA") {
			t.Error("seed iso has no cidata label")
		}
		if !strings.Contains(string(iso), base64.StdEncoding.EncodeToString([]byte("s3cr3t-value"))) {
			t.Error("seed iso lacks the secret")
		}
		if _, err := os.Stat(filepath.Join(dir, seedDirName)); !os.IsNotExist(err) {
			t.Error("the plain seed directory survived")
		}
		noSecretOnDisk(t, []byte("s3cr3t-value"), r.opts.Root)
		// QEMU opens the in-memory seed, after a stop too.
		for i := 0; i < 2; i++ {
			if _, err := r.Start(ctx, id); err != nil {
				t.Fatalf("start %d: %v", i, err)
			}
			noSecretOnDisk(t, []byte("s3cr3t-value"), r.opts.Root)
			if _, err := r.Stop(ctx, id, 0); err != nil {
				t.Fatalf("stop %d: %v", i, err)
			}
		}
		if st.Spec.Secrets != nil {
			t.Error("status carries secrets")
		}
		// Same spec, other secret value: a different instance.
		s.Secrets = map[string][]byte{"token": []byte("other")}
		if _, err := r.Create(ctx, s); !errors.Is(err, runtime.ErrExists) {
			t.Errorf("Create with other secrets: %v, want ErrExists", err)
		}
	})
	t.Run("qemu refuses the command line", func(t *testing.T) {
		const id = "badpci"
		destroyAtEnd(t, r, id)
		s := e.spec(id)
		s.Devices.PCI = []string{"0000:ff:1f.7"}
		if _, err := r.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		st, err := r.Start(ctx, id)
		if runtime.ReasonOf(err, "") != api.ReasonVMStartFailed || !strings.Contains(err.Error(), "0000:ff:1f.7") {
			t.Fatalf("Start: %v, want vm_start_failed with QEMU's message", err)
		}
		t.Logf("start error: %v", err)
		if st.State != runtime.StateCreated || st.PID != 0 {
			t.Errorf("after a failed start: %+v, want created", st)
		}
		if n := countQEMU(t, r, filepath.Join(r.instDir, id, qmpSock)); n != 0 {
			t.Errorf("%d qemu processes after a failed start", n)
		}
	})
}

// TestRealRecoverKillsQEMUWithoutDir: a QEMU whose instance directory is
// gone is killed by Recover (a QEMU never outlives its instance). The spec
// has no readiness condition: Ready comes from QMP query-status.
func TestRealRecoverKillsQEMUWithoutDir(t *testing.T) {
	if goruntime.GOOS != "linux" {
		t.Skip("finding QEMUs by their command line needs /proc")
	}
	e := newRealEnv(t)
	ctx := context.Background()
	r := e.runtime(t)
	const id = "stray"
	destroyAtEnd(t, r, id)
	spec := e.spec(id)
	spec.Readiness = runtime.Readiness{}
	if _, err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	st, err := r.Start(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	waitReadyStatus(t, r, id, 10*time.Second)
	_ = r.Close()
	qmpPath := filepath.Join(r.instDir, id, qmpSock)
	if err := os.RemoveAll(filepath.Join(r.instDir, id)); err != nil {
		t.Fatal(err)
	}
	if !processAlive(st.PID, qmpPath) {
		t.Fatal("qemu died with its directory")
	}
	r2 := e.runtime(t)
	list, err := r2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Errorf("recovered %v, want nothing", list)
	}
	if !waitGone(ctx, st.PID, qmpPath, 10*time.Second) {
		t.Fatal("qemu without an instance directory survived Recover")
	}
}

// TestRealTap boots in tap mode on a throw-away bridge (needs root and
// iproute2; skipped otherwise): the tap is enslaved to the bridge while the
// VM runs and removed when it exits. A missing bridge is
// network_setup_failed.
func TestRealTap(t *testing.T) {
	if goruntime.GOOS != "linux" {
		t.Skip("tap networking is linux-only")
	}
	e := newRealEnv(t)
	ctx := context.Background()
	r := e.runtime(t)

	missing := e.spec("nobridge")
	missing.VM.Network = runtime.VMNetwork{Mode: api.NetworkTap, Bridge: "drvnone0"}
	destroyAtEnd(t, r, "nobridge")
	if _, err := r.Create(ctx, missing); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, "nobridge"); runtime.ReasonOf(err, "") != api.ReasonNetworkSetupFailed {
		t.Fatalf("Start on a missing bridge: %v, want network_setup_failed", err)
	}
	if st, _ := r.Inspect(ctx, "nobridge"); st.State != runtime.StateCreated {
		t.Errorf("after the failed start: %s", st.State)
	}
	if err := exec.Command("ip", "link", "show", "dev", tapName(filepath.Join(r.instDir, "nobridge"))).Run(); err == nil {
		t.Error("a failed tap setup left its tap device behind")
	}

	bridge := "drvtbr" + strconv.Itoa(os.Getpid()%100000)
	if out, err := exec.Command("ip", "link", "add", bridge, "type", "bridge").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" && os.Geteuid() == 0 {
			t.Fatalf("create bridge: %v: %s", err, out)
		}
		t.Skipf("cannot create a bridge (needs root and iproute2): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", bridge).Run() })

	const id = "tapvm"
	destroyAtEnd(t, r, id)
	spec := e.spec(id)
	spec.VM.Network = runtime.VMNetwork{Mode: api.NetworkTap, Bridge: bridge, MAC: "52:54:00:aa:bb:cc"}
	if _, err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	tap := tapName(filepath.Join(r.instDir, id))
	out, err := exec.Command("ip", "-o", "link", "show", "dev", tap).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "master "+bridge) {
		t.Errorf("tap %s: %v: %s; want it enslaved to %s", tap, err, out, bridge)
	}
	if _, err := r.Stop(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("ip", "link", "show", "dev", tap).Run(); err == nil {
		t.Errorf("tap %s survives the VM", tap)
	}
}
