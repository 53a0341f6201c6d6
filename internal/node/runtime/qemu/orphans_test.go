package qemu

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

func TestSweepOrphans(t *testing.T) {
	root := shortDir(t)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	var reported []string
	r := newTestRuntime(t, root, nil, func(o *Options) {
		o.Now = func() time.Time { return now }
		o.OrphanGrace = 10 * time.Minute
		o.OnOrphanRemoved = func(p string) {
			mu.Lock()
			reported = append(reported, p)
			mu.Unlock()
		}
	})
	ov := r.overlayDir
	mk := func(name string, age time.Duration) string {
		p := filepath.Join(ov, name)
		if err := os.WriteFile(p, []byte("qcow"), 0o600); err != nil {
			t.Fatal(err)
		}
		mt := now.Add(-age)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
		return p
	}
	oldOrphan := mk("gone.qcow2", time.Hour)
	oldJunk := mk("stray.tmp", time.Hour)
	young := mk("new-one.qcow2", time.Minute)
	onDisk := mk("ondisk.qcow2", time.Hour) // state dir exists, not recovered yet
	if err := os.MkdirAll(filepath.Join(r.instDir, "ondisk"), 0o700); err != nil {
		t.Fatal(err)
	}
	known := mk("known.qcow2", time.Hour) // in memory
	r.put(&instance{id: "known", dir: filepath.Join(r.instDir, "known"), st: persisted{State: runtime.StateCreated}})
	if err := os.Mkdir(filepath.Join(ov, "subdir"), 0o700); err != nil {
		t.Fatal(err)
	}

	removed, err := r.SweepOrphans(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{oldOrphan, oldJunk}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	mu.Lock()
	slices.Sort(reported)
	if !slices.Equal(reported, want) {
		t.Errorf("reported %v, want %v", reported, want)
	}
	mu.Unlock()
	for _, p := range []string{young, onDisk, known} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	for _, p := range want {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists", p)
		}
	}

	// The loop sweeps at once and stops with its context.
	orphan2 := mk("later.qcow2", time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.RunOrphanLoop(ctx, time.Hour); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(orphan2); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("RunOrphanLoop did not sweep")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunOrphanLoop did not stop with its context")
	}
}
