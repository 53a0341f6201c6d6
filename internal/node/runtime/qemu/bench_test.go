package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
)

// Run with: go test -run '^$' -bench . -benchtime 20x ./internal/node/runtime/qemu/
// (boot benchmarks: -bench 'ToReady' -benchtime 3x).

func overlayBase(b *testing.B) (qemutest.Guest, string) {
	g := qemutest.Build(b, "")
	return g, b.TempDir()
}

// BenchmarkOverlayCreate is Create's disk step in the steady state: the
// base's qemu-img info is cached per blob, so this is one qemu-img create.
func BenchmarkOverlayCreate(b *testing.B) {
	g, dir := overlayBase(b)
	r := newTestRuntime(b, shortDir(b), nil, func(o *Options) { o.QEMUImg = g.QEMUImg })
	ctx := context.Background()
	if _, err := r.inspect(ctx, g.Disk, ""); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		info, err := r.inspect(ctx, g.Disk, "")
		if err != nil {
			b.Fatal(err)
		}
		if err := CreateOverlay(ctx, g.QEMUImg, g.Disk, info, filepath.Join(dir, fmt.Sprintf("o%d.qcow2", i)), 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOverlayCreateFirst is the first Create over a base: qemu-img
// info (image.Inspect), then qemu-img create.
func BenchmarkOverlayCreateFirst(b *testing.B) {
	g, dir := overlayBase(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		info, err := image.Inspect(ctx, g.QEMUImg, g.Disk, "")
		if err != nil {
			b.Fatal(err)
		}
		if err := CreateOverlay(ctx, g.QEMUImg, g.Disk, info, filepath.Join(dir, fmt.Sprintf("o%d.qcow2", i)), 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkQEMUImgExec is the floor: starting qemu-img to print its version.
func BenchmarkQEMUImgExec(b *testing.B) {
	g, _ := overlayBase(b)
	for range b.N {
		if err := exec.Command(g.QEMUImg, "--version").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateToReady measures Create → Start → EventReady through the
// adapter (the serial marker, polled every 20 ms).
func BenchmarkCreateToReady(b *testing.B) {
	g := qemutest.Build(b, "")
	e := realEnv{g: g, root: shortDir(b)}
	r := e.runtimeB(b)
	ctx := context.Background()
	var create, start, ready time.Duration
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("bench%d", i)
		sub, cancel := context.WithCancel(ctx)
		events := r.Subscribe(sub)
		t0 := time.Now()
		if _, err := r.Create(ctx, e.spec(id)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := r.Start(ctx, id); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		waitReadyEvent(b, events, id)
		t3 := time.Now()
		create, start, ready = create+t1.Sub(t0), start+t2.Sub(t1), ready+t3.Sub(t2)
		cancel()
		b.StopTimer()
		if err := r.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(create.Milliseconds())/n, "create-ms")
	b.ReportMetric(float64(start.Milliseconds())/n, "start-ms")
	b.ReportMetric(float64(ready.Milliseconds())/n, "start-to-ready-ms")
}

// BenchmarkByHandToReady runs the identical QEMU command line the adapter
// builds (CommandLine) by hand: exec, then poll its serial log every 5 ms
// for the marker. The instance is created (overlay made) outside the timer.
func BenchmarkByHandToReady(b *testing.B) {
	g := qemutest.Build(b, "")
	e := realEnv{g: g, root: shortDir(b)}
	r := e.runtimeB(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		id := fmt.Sprintf("hand%d", i)
		if _, err := r.Create(ctx, e.spec(id)); err != nil {
			b.Fatal(err)
		}
		bin, args, err := r.CommandLine(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		dir := filepath.Join(r.instDir, id)
		b.StartTimer()
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		for {
			if log, _ := os.ReadFile(filepath.Join(dir, serialLogName)); bytes.Contains(log, []byte(g.Marker)) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		b.StopTimer()
		pid, err := readPidFile(filepath.Join(dir, pidFileName))
		if err != nil {
			b.Fatal(err)
		}
		qmp := filepath.Join(dir, qmpSock)
		_ = killProcess(pid, qmp)
		waitGone(ctx, pid, qmp, 10*time.Second)
		if err := r.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func (e realEnv) runtimeB(b *testing.B) *Runtime {
	return newTestRuntime(b, e.root, []string{filepath.Dir(e.g.Initrd), filepath.Dir(e.g.Kernel)},
		func(o *Options) { o.QEMUBinary, o.QEMUImg, o.Log = e.g.QEMU, e.g.QEMUImg, discardLog() })
}

func waitReadyEvent(b *testing.B, events <-chan runtime.Event, id string) {
	deadline := time.After(readyTimeout)
	for {
		select {
		case ev := <-events:
			if ev.ID == id && ev.Kind == runtime.EventReady {
				return
			}
			if ev.ID == id && ev.Kind == runtime.EventExited {
				b.Fatalf("exited: %+v", ev)
			}
		case <-deadline:
			b.Fatal("not ready")
		}
	}
}
