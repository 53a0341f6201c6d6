package slicevm

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestReleaseHardStop: a guest that ignores the shutdown request is killed
// after graceful_timeout_seconds and the result says hard_stopped.
func TestReleaseHardStop(t *testing.T) {
	tests := []struct {
		name     string
		ignore   bool
		graceful int
	}{
		{"graceful", false, 0},
		{"ignores stop", true, 45},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			params := e.failureParams()
			if _, _, err := e.p.Provision(context.Background(), params, nil); err != nil {
				t.Fatal(err)
			}
			e.rt.SetBehavior("vm-1", mock.Behavior{IgnoreStop: tc.ignore})
			out, _, err := e.p.Release(context.Background(), task.VMReleaseParams{VMName: "vm-1", GracefulTimeoutSeconds: tc.graceful}, nil)
			if err != nil {
				t.Fatalf("Release: %v\n%+v", err, out.Phases)
			}
			want := time.Duration(tc.graceful) * time.Second
			if tc.graceful == 0 {
				want = 60 * time.Second
			}
			if out.HardStopped != tc.ignore || !reflect.DeepEqual(e.rt.graceful, []time.Duration{want}) ||
				!reflect.DeepEqual(out.Slots, []string{"slot-0"}) || out.AlreadyReleased || len(out.Wiped) != 0 {
				t.Errorf("release = %+v, graceful %v", out, e.rt.graceful)
			}
			if tc.ignore && !strings.Contains(phaseResult(t, out.Phases, ReleaseShutdown).Detail, "hard_stopped") {
				t.Errorf("shutdown = %+v", out.Phases[0])
			}
			if _, ok := out.Timings[ReleaseWipe+"_ms"]; ok {
				t.Error("wipe ran without wipe=true")
			}
			assertGone(t, e, "vm-1", "slot-0")
		})
	}
}

// TestReleaseKeepsLeaseOnFailure: when the device cannot be rebound, the
// release stops there and the slot stays leased.
func TestReleaseKeepsLeaseOnFailure(t *testing.T) {
	e := newEnv(t, envOpts{})
	if _, _, err := e.p.Provision(context.Background(), e.failureParams(), nil); err != nil {
		t.Fatal(err)
	}
	// The GPU falls back to a host driver while the VM runs, and the host
	// has no driver_override to bind it back with.
	drv := e.p.pciDev(gpuAddr, "driver")
	if err := os.Remove(drv); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(e.p.root("sys", "bus", "pci", "drivers", "nvidia"), drv); err != nil {
		t.Fatal(err)
	}
	out, _, err := e.p.Release(context.Background(), task.VMReleaseParams{VMName: "vm-1"}, nil)
	fe := asError(t, err)
	if fe.Phase != ReleaseVFIORebind || fe.Blocker != "vfio_not_bound:"+gpuAddr || out.FailedPhase != ReleaseVFIORebind {
		t.Fatalf("err = %+v", fe)
	}
	if l, err := e.p.readLease("slot-0"); err != nil || l.VMName != "vm-1" {
		t.Errorf("lease = %+v, %v", l, err)
	}
	if _, err := e.rt.Inspect(context.Background(), "vm-1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("vm not undefined: %v", err)
	}
}

// TestReleaseRefusesOtherOwners: a release never stops an instance the
// slice provisioner does not own.
func TestReleaseRefusesOtherOwners(t *testing.T) {
	e := newEnv(t, envOpts{bare: true})
	ctx := context.Background()
	if _, err := e.rt.Create(ctx, runtime.Spec{ID: "web-1", Owner: "reconciler"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Start(ctx, "web-1"); err != nil {
		t.Fatal(err)
	}
	_, _, err := e.p.Release(ctx, task.VMReleaseParams{VMName: "web-1"}, nil)
	if fe := asError(t, err); fe.Code != CodeVMNameInUse || fe.Phase != ReleaseShutdown {
		t.Fatalf("err = %+v", fe)
	}
	if st, err := e.rt.Inspect(ctx, "web-1"); err != nil || st.State != runtime.StateRunning {
		t.Errorf("web-1 = %+v, %v", st, err)
	}
}

func TestMergeSlots(t *testing.T) {
	leases := []Lease{{SlotID: "s0", PCIAddress: "a", NVMeDevice: "/dev/x"}, {SlotID: "s1", PCIAddress: "b"}}
	got := mergeSlots([]task.VMReleaseSlot{{SlotID: "s0", FabricDevice: "f"}, {SlotID: "s9", PCIAddress: "z"}}, leases)
	want := []task.VMReleaseSlot{{SlotID: "s0", PCIAddress: "a", FabricDevice: "f", NVMeDevice: "/dev/x"},
		{SlotID: "s9", PCIAddress: "z"}, {SlotID: "s1", PCIAddress: "b"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mergeSlots = %+v", got)
	}
}

func TestZeroDevice(t *testing.T) {
	path := t.TempDir() + "/disk"
	writeFile(t, path, []byte(strings.Repeat("x", wipeChunk+123)))
	n, err := zeroDevice(context.Background(), path)
	b, _ := os.ReadFile(path)
	if err != nil || n != wipeChunk+123 || len(b) != wipeChunk+123 || strings.Trim(string(b), "\x00") != "" {
		t.Fatalf("zeroDevice = %d, %v (%d bytes left non-zero)", n, err, len(strings.Trim(string(b), "\x00")))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := zeroDevice(ctx, path); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled zeroDevice = %v", err)
	}
}

func TestGuestsSkipsUnreadable(t *testing.T) {
	e := newEnv(t, envOpts{bare: true})
	g, err := e.p.Guests(context.Background())
	if err != nil || len(g) != 0 {
		t.Fatalf("no registrations: %v, %v", g, err)
	}
	for name, body := range map[string]string{"b.json": `{"vm_name":"b"}`, "a.json": `{"vm_name":"a"}`, "bad.json": "{", ".tmp-1": "{}"} {
		if err := writeAtomic(e.p.telemetryDir()+"/"+name, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g, err = e.p.Guests(context.Background())
	if err != nil || len(g) != 2 || g[0].VMName != "a" || g[1].VMName != "b" {
		t.Errorf("guests = %+v, %v", g, err)
	}
}

func TestSameDiskOrPartition(t *testing.T) {
	tests := []struct {
		name, disk string
		want       bool
	}{
		{"nvme0n1", "nvme0n1", true},
		{"nvme0n1p2", "nvme0n1", true},
		{"nvme0n10", "nvme0n1", false},
		{"nvme0n1p", "nvme0n1", false},
		{"sda1", "sda", true},
		{"sdaa", "sda", false},
		{"sdb1", "sda", false},
		{"nvme0n1p-1", "nvme0n1", false},
	}
	for _, tc := range tests {
		if got := sameDiskOrPartition(tc.name, tc.disk); got != tc.want {
			t.Errorf("sameDiskOrPartition(%q, %q) = %v", tc.name, tc.disk, got)
		}
	}
}

func TestNew(t *testing.T) {
	rt := mock.New(mock.Options{})
	if _, err := New(Options{Runtime: rt}); err == nil {
		t.Error("New without an image cache succeeded")
	}
	if _, err := New(Options{}); err == nil {
		t.Error("New without a runtime succeeded")
	}
	e := newEnv(t, envOpts{bare: true})
	if _, err := New(Options{Runtime: rt, Images: e.p.opts.Images, StateDir: "rel", CloudInitDir: "/x"}); err == nil {
		t.Error("New with a relative state dir succeeded")
	}
	if e.p.opts.SysfsRoot == "" || e.p.opts.Now == nil || e.p.opts.GOARCH == "" {
		t.Errorf("defaults = %+v", e.p.opts)
	}
}
