//go:build linux

package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/runtimetest"
	"github.com/drover-dev/drover/internal/wire/api"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLifecycleAgainstSpec runs Create, Start, Inspect, Probe, Stop and
// Destroy against the fake, with a tap and MMDS, and checks every request
// the adapter made against the spec and what it carried.
func TestLifecycleAgainstSpec(t *testing.T) {
	e := newTestEnv(t)
	taps := &fakeTaps{}
	r := e.runtime(t, func(o *Options) { o.Taps = taps })
	ctx := testCtx(t)
	spec := e.spec("web-1")
	spec.Owner = "reconciler"
	spec.VM.Network = runtime.VMNetwork{Mode: api.NetworkTap, MAC: "02:fc:00:00:00:01"}
	st, err := r.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != runtime.StateCreated || st.Overlay == "" {
		t.Fatalf("Create = %+v", st)
	}
	if _, err := os.Stat(st.Overlay); err != nil {
		t.Fatalf("rootfs copy: %v", err)
	}
	st, err = r.Start(ctx, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != runtime.StateRunning || st.PID == 0 || st.Accel != "kvm" {
		t.Fatalf("Start = %+v", st)
	}
	waitFor(t, "ready", 10*time.Second, func() bool { s, _ := r.Inspect(ctx, "web-1"); return s.Ready })
	if err := r.Probe(ctx, "web-1"); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	mc, err := NewClient(filepath.Join(r.instDir, "web-1", apiSockName), 0).GetMachineConfig(ctx)
	if err != nil || mc.VCPUCount != 2 || mc.MemSizeMiB != 256 {
		t.Fatalf("GET /machine-config = %+v, %v", mc, err)
	}
	res, err := r.Stop(ctx, "web-1", 10*time.Second)
	if err != nil || res.HardStopped {
		t.Fatalf("Stop = %+v, %v; want a graceful stop", res, err)
	}
	if st, _ := r.Inspect(ctx, "web-1"); st.State != runtime.StateStopped || st.Ready {
		t.Fatalf("after Stop: %+v", st)
	}
	if err := r.Destroy(ctx, "web-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.instDir, "web-1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir after Destroy: %v", err)
	}
	if len(taps.released) != 1 {
		t.Errorf("taps released = %v, want web-1's", taps.released)
	}

	reqs := e.requests(t)
	var got []string
	bodies := map[string]json.RawMessage{}
	for _, q := range reqs {
		if q.Method == "GET" && q.Path == "/" {
			continue // polled
		}
		key := q.Method + " " + q.Path
		if q.Path == "/actions" {
			var a InstanceActionInfo
			_ = json.Unmarshal(q.Body, &a)
			key += " " + a.ActionType
		}
		got = append(got, key)
		bodies[key] = q.Body
	}
	want := []string{"PUT /machine-config", "PUT /boot-source", "PUT /drives/rootfs", "PUT /network-interfaces/eth0",
		"PUT /mmds/config", "PUT /mmds", "PUT /vsock", "PUT /actions InstanceStart", "GET /machine-config", "PUT /actions SendCtrlAltDel"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for key, sub := range map[string]string{
		"PUT /network-interfaces/eth0": `"host_dev_name":"fctap0","guest_mac":"02:fc:00:00:00:01"`,
		"PUT /mmds/config":             `"version":"V2","network_interfaces":["eth0"]`,
		"PUT /mmds":                    `"instance_id":"web-1"`,
		"PUT /boot-source":             `"boot_args":"console=ttyS0 reboot=k panic=1"`,
		"PUT /vsock":                   fmt.Sprintf(`"guest_cid":%d,"uds_path":"%s"`, vsockCID("web-1"), filepath.Join(r.instDir, "web-1", vsockName)),
		"PUT /drives/rootfs":           `"is_root_device":true`,
	} {
		if !strings.Contains(string(bodies[key]), sub) {
			t.Errorf("%s body %s: want it to contain %s", key, bodies[key], sub)
		}
	}
}

// TestStartFailure: Firecracker refusing InstanceStart (400 with a
// fault_message) is firecracker_start_failed carrying the step and the
// message; the process is gone and the instance is back to created.
func TestStartFailure(t *testing.T) {
	e := newTestEnv(t, fakeFailEnv+"=InstanceStart", fakeFaultEnv+"=Cannot load kernel due to invalid memory configuration or invalid kernel image: Kernel Loader: failed to load ELF kernel image")
	r := e.runtime(t)
	ctx := testCtx(t)
	if _, err := r.Create(ctx, e.spec("bad-1")); err != nil {
		t.Fatal(err)
	}
	_, err := r.Start(ctx, "bad-1")
	var rerr *runtime.Error
	if !errors.As(err, &rerr) || rerr.Reason != api.ReasonFirecrackerStartFailed {
		t.Fatalf("Start = %v, want a *runtime.Error firecracker_start_failed", err)
	}
	for _, s := range []string{"InstanceStart", "failed to load ELF kernel image", "400"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Start error %q: want it to carry %q", err, s)
		}
	}
	st, _ := r.Inspect(ctx, "bad-1")
	if st.State != runtime.StateCreated || st.PID != 0 {
		t.Errorf("after a failed start: %+v, want created", st)
	}
	if left := scanProcs(r.instDir); len(left) != 0 {
		t.Errorf("processes left after a failed start: %v", left)
	}
	e.requests(t)
}

// TestStartFailureMissingBinary: a firecracker that cannot run is
// firecracker_start_failed too.
func TestStartFailureMissingBinary(t *testing.T) {
	e := newTestEnv(t)
	r := e.runtime(t, func(o *Options) { o.Binary = filepath.Join(e.files, "no-such-firecracker") })
	ctx := testCtx(t)
	if _, err := r.Create(ctx, e.spec("nobin")); err != nil {
		t.Fatal(err)
	}
	_, err := r.Start(ctx, "nobin")
	if runtime.ReasonOf(err, "") != api.ReasonFirecrackerStartFailed || !strings.Contains(err.Error(), "spawn") {
		t.Fatalf("Start = %v, want firecracker_start_failed at spawn", err)
	}
}

// TestHardStop: a guest that ignores Ctrl+Alt+Del is killed after the
// graceful timeout and the stop says HardStopped.
func TestHardStop(t *testing.T) {
	e := newTestEnv(t, fakeNoCADEnv+"=1")
	r := e.runtime(t)
	ctx := testCtx(t)
	if _, err := r.Create(ctx, e.spec("stubborn")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, "stubborn"); err != nil {
		t.Fatal(err)
	}
	res, err := r.Stop(ctx, "stubborn", 300*time.Millisecond)
	if err != nil || !res.HardStopped {
		t.Fatalf("Stop = %+v, %v; want HardStopped", res, err)
	}
	if st, _ := r.Inspect(ctx, "stubborn"); st.State != runtime.StateStopped {
		t.Errorf("after a hard stop: %s", st.State)
	}
	e.requests(t)
}

// TestCrash: a firecracker that dies unasked is crashed, with an event.
func TestCrash(t *testing.T) {
	e := newTestEnv(t)
	r := e.runtime(t)
	ctx := testCtx(t)
	events := r.Subscribe(ctx)
	if _, err := r.Create(ctx, e.spec("crashy")); err != nil {
		t.Fatal(err)
	}
	st, err := r.Start(ctx, "crashy")
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(st.PID, syscall.SIGKILL)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.Kind != runtime.EventExited {
				continue
			}
			if ev.State != runtime.StateCrashed {
				t.Fatalf("exit event %+v, want crashed", ev)
			}
			if st, _ := r.Inspect(ctx, "crashy"); st.State != runtime.StateCrashed || !strings.Contains(st.ExitDetail, "killed") {
				t.Errorf("after the crash: %s %q", st.State, st.ExitDetail)
			}
			return
		case <-deadline:
			t.Fatal("no exit event")
		}
	}
}

// TestRecover: a new Runtime over the same root adopts the running
// firecracker (same pid, no second process), kills one whose instance
// directory is gone, and a stopped-while-away one reads as crashed.
func TestRecover(t *testing.T) {
	e := newTestEnv(t)
	r1 := e.runtime(t)
	ctx := testCtx(t)
	for _, id := range []string{"keep", "orphan", "dies"} {
		if _, err := r1.Create(ctx, e.spec(id)); err != nil {
			t.Fatal(err)
		}
		if _, err := r1.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "ready", 10*time.Second, func() bool { s, _ := r1.Inspect(ctx, "keep"); return s.Ready })
	keep, _ := r1.Inspect(ctx, "keep")
	orphan, _ := r1.Inspect(ctx, "orphan")
	dies, _ := r1.Inspect(ctx, "dies")
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(dies.PID, syscall.SIGKILL)
	if err := os.RemoveAll(filepath.Join(r1.instDir, "orphan")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "killed process gone", 5*time.Second, func() bool {
		return !processAlive(dies.PID, procKey{"--api-sock", filepath.Join(r1.instDir, "dies", apiSockName)})
	})

	r2 := e.runtime(t)
	list, err := r2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]runtime.Status{}
	for _, s := range list {
		byID[s.ID] = s
	}
	if s := byID["keep"]; s.State != runtime.StateRunning || !s.Adopted || s.PID != keep.PID || !s.Ready {
		t.Errorf("keep after Recover = %+v, want adopted, running, ready, pid %d", s, keep.PID)
	}
	if s := byID["dies"]; s.State != runtime.StateCrashed {
		t.Errorf("dies after Recover = %s, want crashed", s.State)
	}
	if _, ok := byID["orphan"]; ok {
		t.Error("orphan listed after its directory was removed")
	}
	waitFor(t, "orphan killed", 5*time.Second, func() bool {
		return !processAlive(orphan.PID, procKey{"--api-sock", filepath.Join(r1.instDir, "orphan", apiSockName)})
	})
	if pids := scanProcs(r2.instDir)[procKey{"--api-sock", filepath.Join(r2.instDir, "keep", apiSockName)}]; len(pids) != 1 {
		t.Errorf("keep processes = %v, want exactly one", pids)
	}
	if err := r2.Probe(ctx, "keep"); err != nil {
		t.Errorf("Probe of the adopted instance: %v", err)
	}
	res, err := r2.Stop(ctx, "keep", 10*time.Second)
	if err != nil || res.HardStopped {
		t.Errorf("Stop of the adopted instance = %+v, %v", res, err)
	}
	if st, _ := r2.Inspect(ctx, "keep"); st.State != runtime.StateStopped {
		t.Errorf("adopted after Stop: %s", st.State)
	}
	e.requests(t)
}

// TestConformance runs the runtime.Runtime conformance suite against the
// fake.
func TestConformance(t *testing.T) {
	e := newTestEnv(t)
	var mu sync.Mutex
	type entry struct {
		r    *Runtime
		root string
	}
	byTest := map[*testing.T]entry{}
	newRT := func(t *testing.T) runtime.Runtime {
		env := *e
		env.root = shortDir(t)
		r := env.runtime(t)
		mu.Lock()
		byTest[t] = entry{r, env.root}
		mu.Unlock()
		return r
	}
	reopen := func(t *testing.T) runtime.Runtime {
		mu.Lock()
		defer mu.Unlock()
		old := byTest[t]
		_ = old.r.Close()
		env := *e
		env.root = old.root
		r := env.runtime(t)
		byTest[t] = entry{r, old.root}
		return r
	}
	runtimetest.Run(t, newRT, func(_ *testing.T, id string) runtime.Spec { return e.spec(id) },
		runtimetest.Options{ReadyTimeout: 10 * time.Second, Graceful: 10 * time.Second, Reopen: reopen})
	e.requests(t)
}
