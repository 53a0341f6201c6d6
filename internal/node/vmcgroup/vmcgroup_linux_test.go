package vmcgroup

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// newManager makes a Manager under a parent of the test's own, removed
// afterwards; hosts without a writable memory controller skip (fail under
// CI=true).
func newManager(t *testing.T) *Manager {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("CI") == "true" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("memory cgroups need root")
	}
	m, err := New(Options{Parent: fmt.Sprintf("drover-test-%d-%d", os.Getpid(), time.Now().UnixNano())})
	if err != nil {
		skip("memory cgroups: %v", err)
	}
	t.Cleanup(func() {
		ents, _ := os.ReadDir(m.Dir())
		for _, e := range ents {
			if e.IsDir() {
				g, _ := m.Group(e.Name())
				emptyGroup(t, g)
				_ = g.Remove()
			}
		}
		if err := m.RemoveParent(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return m
}

// emptyGroup kills what is left in g and waits until it is empty: a
// test's cleanup kills the sh of startIn, but a command sh forked (the
// sleep of "read go; sleep 30") lives on in the group, which then cannot
// be removed (EBUSY).
func emptyGroup(t *testing.T, g *Group) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, err := g.Procs()
		if err != nil || len(procs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cgroup %s still holds %v", g.Path, procs)
			return
		}
		for _, pid := range procs {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startIn starts sh -c script in g: it waits for a line on stdin, sent
// once the process is in the cgroup.
func startIn(t *testing.T, g *Group, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "read go; "+script)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := g.AddProcess(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if procs, _ := g.Procs(); !slices.Contains(procs, cmd.Process.Pid) {
		t.Fatalf("pid %d not in %s: %v", cmd.Process.Pid, g.Path, procs)
	}
	_, _ = io.WriteString(in, "go\n")
	return cmd
}

func TestOOMKillDetected(t *testing.T) {
	m := newManager(t)
	g, err := m.Create("hog", 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	cmd := startIn(t, g, "exec tail /dev/zero")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("memory hog not killed within 30s")
	}
	if err == nil {
		t.Fatal("memory hog exited cleanly")
	}
	oom, err := g.OOMKilled()
	if err != nil || !oom {
		t.Fatalf("OOMKilled = %v, %v (exit %v)", oom, err, cmd.ProcessState)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Path); !os.IsNotExist(err) {
		t.Fatalf("cgroup still there: %v", err)
	}
}

func TestCleanExitIsNotOOM(t *testing.T) {
	m := newManager(t)
	g, err := m.Create("calm", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	cmd := startIn(t, g, "exit 3")
	_ = cmd.Wait()
	if oom, err := g.OOMKilled(); err != nil || oom {
		t.Fatalf("OOMKilled = %v, %v", oom, err)
	}
}

func TestReconcileRemovesEmptyOrphans(t *testing.T) {
	m := newManager(t)
	for _, id := range []string{"live", "gone", "busy"} {
		if _, err := m.Create(id, 0); err != nil {
			t.Fatal(err)
		}
	}
	busy, _ := m.Group("busy")
	startIn(t, busy, "sleep 30")
	removed, err := m.Reconcile([]string{"live"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{"gone"}) {
		t.Fatalf("removed %v", removed)
	}
	for _, bad := range []string{"../x", "a/b", ""} {
		if _, err := m.Group(bad); err == nil {
			t.Fatalf("id %q accepted", bad)
		}
	}
}
