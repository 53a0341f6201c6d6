package qemu

import (
	"context"
	"fmt"
	"os"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/vmcgroup"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestRealOOMKilled runs QEMU in a memory cgroup (guest 256 MiB + 64 MiB
// overhead), makes QEMU itself allocate past the limit (QMP object-add of
// a preallocated 1 GiB RAM backend), and expects the kernel's OOM kill to
// end the instance as crashed with oom_killed; a plain stop afterwards is
// not OOM. Needs root and a memory cgroup controller (fails under CI=true
// without them).
func TestRealOOMKilled(t *testing.T) {
	if goruntime.GOOS != "linux" || os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" && goruntime.GOOS == "linux" {
			t.Fatal("memory cgroups need root")
		}
		t.Skip("memory cgroups need root on linux")
	}
	cg, err := vmcgroup.New(vmcgroup.Options{Parent: fmt.Sprintf("drover-qemutest-%d", os.Getpid())})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("memory cgroups: %v", err)
	}
	t.Cleanup(func() {
		if err := cg.RemoveParent(); err != nil {
			t.Errorf("cgroup parent left behind: %v", err)
		}
	})
	e := newRealEnv(t)
	ctx := context.Background()
	r := e.runtime(t, func(o *Options) { o.Cgroups, o.CgroupOverheadMiB = cg, 64 })
	events := r.Subscribe(ctx)

	const id = "oomvm"
	destroyAtEnd(t, r, id)
	if _, err := r.Create(ctx, e.spec(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	g, _ := cg.Group(id)
	in := r.get(id)
	in.mu.Lock()
	p, pid := in.proc, in.st.PID
	in.mu.Unlock()
	if procs, err := g.Procs(); err != nil || !slices.Contains(procs, pid) {
		t.Fatalf("qemu %d not in its cgroup: %v %v", pid, procs, err)
	}
	// QEMU preallocates (touches) 1 GiB of host memory: past the limit.
	err = p.execute(ctx, time.Minute, "object-add", map[string]any{
		"qom-type": "memory-backend-ram", "id": "hog", "size": 1 << 30, "prealloc": true}, nil)
	t.Logf("object-add: %v", err)
	ev := waitEvent(t, events, id, runtime.EventExited, time.Minute)
	if ev.State != runtime.StateCrashed || ev.Reason != api.ReasonOOMKilled {
		t.Fatalf("exit %s %q (%s), want crashed oom_killed", ev.State, ev.Reason, ev.Detail)
	}
	if st, _ := r.Inspect(ctx, id); st.ExitReason != api.ReasonOOMKilled {
		t.Fatalf("inspect: %+v", st)
	}
	if _, err := os.Stat(g.Path); !os.IsNotExist(err) {
		t.Fatalf("cgroup of the exited qemu still there: %v", err)
	}

	// A restart gets a fresh cgroup: a requested stop is not an OOM kill.
	if _, err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Stop(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.Inspect(ctx, id); st.State != runtime.StateStopped || st.ExitReason != "" {
		t.Fatalf("after stop: %s %q", st.State, st.ExitReason)
	}
}
