package qemu

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestRealMicroVM boots a root filesystem (busybox and the test HTTP
// server, mkfs.ext4 -d) as a microVM under TCG: -M microvm, the Debian
// test kernel with drover-init's initramfs, the config drive with the
// command, env and a secret; Ready by HTTP through the user-mode forward;
// a graceful stop through the power button and the init; then a workload
// that exits 3 (crashed, the code in the detail) and one that eats the
// guest's memory (oom_killed from the init's report).
func TestRealMicroVM(t *testing.T) {
	t0 := time.Now()
	kit := microvmtest.Build(t, "")
	dir := t.TempDir()
	rootfs := microvmtest.Rootfs(t, dir)
	sum, err := qemutest.FileSHA256(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kit and rootfs built in %v (modules: %v)", time.Since(t0).Round(time.Millisecond), kit.Modules)
	r := newTestRuntime(t, shortDir(t), []string{dir}, func(o *Options) {
		o.QEMUBinary, o.QEMUImg = kit.QEMU, kit.QEMUImg
		o.MicroVM = &MicroVMOptions{Kernel: kit.Kernel, Initrd: kit.Initrd}
	})
	if n := r.Names(); len(n) != 2 || n[1] != MicroVMName {
		t.Errorf("names %v", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := r.Subscribe(ctx)
	spec := func(id string, mem int, cmd ...string) runtime.Spec {
		return runtime.Spec{ID: id, Owner: "test", Image: runtime.Image{URL: "file://" + rootfs, SHA256: sum},
			Command: cmd, Env: map[string]string{"PORT": "8080", "LIST_DIR": guestinit.SecretsDir},
			Ports:     []api.PortForward{{Name: "http", GuestPort: 8080}},
			Resources: runtime.Resources{VCPUs: 1, MemoryMiB: mem},
			Readiness: runtime.Readiness{Readiness: api.Readiness{TCPPort: 8080, HTTPPath: "/health", Timeout: api.Duration(2 * time.Minute)}},
			Secrets:   map[string][]byte{"api_token": []byte("s3cret-value")},
			VM:        &runtime.VMSpec{MicroVM: true}}
	}

	// Boot to Ready by HTTP.
	s := spec("mv1", 256, "/testserver")
	if _, err := r.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, r, "mv1")
	bin, args, err := r.CommandLine(ctx, "mv1")
	if err != nil {
		t.Fatal(err)
	}
	if line := strings.Join(args, " "); !strings.Contains(line, "-machine microvm") || !strings.Contains(line, "tsc_early_khz=") ||
		!strings.Contains(line, "serial=drover-config") {
		t.Errorf("command line %s %s", bin, line)
	}
	start := time.Now()
	if _, err := r.Start(ctx, "mv1"); err != nil {
		t.Fatal(err)
	}
	st, _ := r.Inspect(ctx, "mv1")
	for !st.Ready && st.State == runtime.StateRunning && time.Since(start) < time.Minute {
		time.Sleep(20 * time.Millisecond)
		st, _ = r.Inspect(ctx, "mv1")
	}
	if !st.Ready {
		t.Fatalf("not ready after %v: %s %s\n%s", time.Since(start), st.State, st.ExitDetail, serialLog(t, st))
	}
	ready := time.Since(start)
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(st.Ports["http"]) + "/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if strings.TrimSpace(string(body)) != "ok" {
		t.Errorf("GET /health: %q", body)
	}
	if err := r.Probe(ctx, "mv1"); err != nil {
		t.Errorf("probe: %v", err)
	}
	log := serialLog(t, st)
	reps := guestinit.ParseReports([]byte(log))
	if len(reps) == 0 || reps[0].Event != guestinit.EventStarted {
		t.Fatalf("no started report in the serial log:\n%s", log)
	}
	if !strings.Contains(log, "list "+guestinit.SecretsDir+" 1 <nil>") {
		t.Errorf("the workload did not see one secret in %s:\n%s", guestinit.SecretsDir, log)
	}
	if strings.Contains(log, "s3cret-value") {
		t.Error("the secret's value is in the serial log")
	}
	t.Logf("start → Ready by HTTP in %v; workload started at guest uptime %d ms", ready.Round(time.Millisecond), reps[0].UptimeMS)

	// Graceful stop: power button → init → SIGTERM → exit 0 → poweroff.
	res, err := r.Stop(ctx, "mv1", 30*time.Second)
	if err != nil || res.HardStopped {
		t.Fatalf("stop: %+v, %v\n%s", res, err, serialLog(t, st))
	}
	if st, _ = r.Inspect(ctx, "mv1"); st.State != runtime.StateStopped {
		t.Errorf("after stop: %s (%s)", st.State, st.ExitDetail)
	}
	if rep, ok := lastReport(st.SerialLog, 0); !ok || rep.Event != guestinit.EventExited || rep.ExitCode != 0 {
		t.Errorf("last report %+v", rep)
	}
	t.Logf("graceful stop took %v", res.Took.Round(time.Millisecond))

	// A workload that exits 3.
	if _, err := r.Create(ctx, spec("mv2", 256, "/bin/sh", "-c", "echo bye; exit 3")); err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, r, "mv2")
	if _, err := r.Start(ctx, "mv2"); err != nil {
		t.Fatal(err)
	}
	ev := waitExit(t, r, events, "mv2")
	if ev.State != runtime.StateCrashed || ev.Detail != "workload exited with code 3" {
		t.Errorf("exit 3: %s %q %q", ev.State, ev.Reason, ev.Detail)
	}

	// A workload that eats the guest's memory: the guest kernel's OOM
	// killer kills it, the init reports it, the instance is oom_killed.
	if _, err := r.Create(ctx, spec("mv3", 128, "/bin/sh", "-c", "x=0123456789; while :; do x=$x$x; done")); err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, r, "mv3")
	t3 := time.Now()
	if _, err := r.Start(ctx, "mv3"); err != nil {
		t.Fatal(err)
	}
	ev = waitExit(t, r, events, "mv3")
	if ev.State != runtime.StateCrashed || ev.Reason != api.ReasonOOMKilled {
		st, _ := r.Inspect(ctx, "mv3")
		t.Errorf("oom: %s %q %q\n%s", ev.State, ev.Reason, ev.Detail, serialLog(t, st))
	}
	t.Logf("oom workload ended in %v: %s", time.Since(t3).Round(time.Millisecond), ev.Detail)
	_ = os.Remove(filepath.Join(dir, "tree"))
}

// waitExit waits for id's exited event, showing its serial log if none
// comes.
func waitExit(t *testing.T, r *Runtime, events <-chan runtime.Event, id string) runtime.Event {
	t.Helper()
	deadline := time.After(90 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.ID == id && ev.Kind == runtime.EventExited {
				return ev
			}
		case <-deadline:
			st, _ := r.Inspect(context.Background(), id)
			t.Fatalf("%s did not exit: %s\n%s", id, st.State, serialLog(t, st))
		}
	}
}
