package diag

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

const gib = 1 << 30

// okFS reports a 100 GiB filesystem with 40 GiB used.
func okFS(context.Context, string) (fsUsage, error) {
	return fsUsage{total: 100 * gib, used: 40 * gib, free: 60 * gib}, nil
}

func newTestProber(t *testing.T, r fakeRoots, goos string) *Prober {
	t.Helper()
	p := NewProber(Config{
		SysRoot: r.sys, ProcRoot: r.proc, DevRoot: r.dev,
		DefaultDiagnosticPath: t.TempDir(),
		GOOS:                  goos,
	})
	p.statFS = okFS
	return p
}

func checksByName(rep Report) map[string]Check {
	m := map[string]Check{}
	for _, c := range rep.Checks {
		m[c.Name] = c
	}
	return m
}

func TestProbeFakeHosts(t *testing.T) {
	allVFIO := "vfio_pci 16384 0 - Live 0x0000000000000000\nvfio 45056 2 vfio_pci, Live 0x0000000000000000\nkvm_intel 380928 0 - Live 0x0\n"
	tests := []struct {
		name        string
		host        fakeHost
		goos        string
		wantKernel  string
		wantMemMB   [3]int // total, free, available
		wantGPUs    []string
		wantFabric  []FabricLink
		wantKVM     KVMStatus // Path is filled in by the test
		wantVFIO    map[string]bool
		wantReasons map[string]string // check name -> reason ("" means OK with no reason)
		wantHealthy bool
		otherAccel  string // Config.OtherAccel
	}{
		{
			name: "gpu host: 2 NVIDIA + 1 Mellanox up at 100G",
			host: fakeHost{
				osrelease: "6.8.0-45-generic", meminfo: gpuHostMeminfo,
				modules: strPtr(allVFIO), sysModules: []string{"vfio_iommu_type1"}, kvm: true,
				pci: []fakePCI{
					{addr: "0000:00:00.0", vendor: "0x8086", device: "0x09a2", class: "0x060000", numa: "0"},
					{addr: "0000:3b:00.0", vendor: "0x10de", device: "0x2330", class: "0x030200", numa: "0", driver: "nvidia"},
					{addr: "0000:3b:00.1", vendor: "0x10de", device: "0x22a3", class: "0x040300", numa: "0"},
					{addr: "0000:86:00.0", vendor: "0x10de", device: "0x2330", class: "0x030200", numa: "1", driver: "vfio-pci"},
					{addr: "0000:af:00.0", vendor: "0x15b3", device: "0x1021", class: "0x020700", numa: "1", driver: "mlx5_core",
						nets: []fakeNet{{name: "ibp175s0", operstate: "up", speed: "100000"}}},
				},
			},
			goos: "linux", wantKernel: "6.8.0-45-generic",
			wantMemMB: [3]int{515899, 390625, 488281},
			wantGPUs:  []string{"0000:3b:00.0", "0000:86:00.0"},
			wantFabric: []FabricLink{{PCIAddress: "0000:af:00.0", Device: "0x1021", NUMANode: 1, Driver: "mlx5_core",
				Interface: "ibp175s0", OperState: "up", SpeedMbps: 100000, Up: true}},
			wantKVM:     KVMStatus{Present: true, Openable: true},
			wantVFIO:    map[string]bool{"vfio": true, "vfio_pci": true, "vfio_iommu_type1": true},
			wantReasons: map[string]string{PhaseGPU: "", PhaseFabric: "", PhaseKVM: "", PhaseVFIO: "", PhaseRootFS: "", PhaseDiagnosticPath: ""},
			wantHealthy: true,
		},
		{
			name: "no gpu, no vfio, no kvm, no pci dir",
			host: fakeHost{osrelease: "5.15.0", meminfo: "MemTotal: 2097152 kB\nMemFree: 1048576 kB\nBuffers: 0 kB\nCached: 524288 kB\n", noPCIDir: true},
			goos: "linux", wantKernel: "5.15.0",
			wantMemMB:  [3]int{2048, 1024, 1536},
			wantGPUs:   []string{},
			wantFabric: []FabricLink{},
			wantKVM:    KVMStatus{},
			wantVFIO:   map[string]bool{"vfio": false, "vfio_pci": false, "vfio_iommu_type1": false},
			// VFIO only passes GPUs through: without a GPU its absence
			// is not_applicable; KVM is still expected.
			wantReasons: map[string]string{PhaseKVM: ReasonKVMMissing, PhaseVFIO: ReasonNotApplicable, PhaseGPU: "", PhaseFabric: ""},
		},
		{
			name: "tcg host: no kvm, no gpu, VMs configured to run with tcg",
			host: fakeHost{osrelease: "6.1.0", meminfo: "MemTotal: 2097152 kB\nMemFree: 1048576 kB\nBuffers: 0 kB\nCached: 524288 kB\n", noPCIDir: true},
			goos: "linux", wantKernel: "6.1.0", otherAccel: "tcg",
			wantMemMB:   [3]int{2048, 1024, 1536},
			wantGPUs:    []string{},
			wantFabric:  []FabricLink{},
			wantKVM:     KVMStatus{},
			wantVFIO:    map[string]bool{"vfio": false, "vfio_pci": false, "vfio_iommu_type1": false},
			wantReasons: map[string]string{PhaseKVM: ReasonNotApplicable, PhaseVFIO: ReasonNotApplicable},
			wantHealthy: true,
		},
		{
			name: "gpu host without vfio modules: vfio is missing, whatever the accelerator",
			host: fakeHost{
				osrelease: "6.1.0", meminfo: gpuHostMeminfo, modules: strPtr(""), kvm: true,
				pci: []fakePCI{{addr: "0000:3b:00.0", vendor: "0x10de", device: "0x2330", class: "0x030200"}},
			},
			goos: "linux", wantKernel: "6.1.0", otherAccel: "tcg",
			wantMemMB:   [3]int{515899, 390625, 488281},
			wantGPUs:    []string{"0000:3b:00.0"},
			wantFabric:  []FabricLink{},
			wantKVM:     KVMStatus{Present: true, Openable: true},
			wantVFIO:    map[string]bool{"vfio": false, "vfio_pci": false, "vfio_iommu_type1": false},
			wantReasons: map[string]string{PhaseKVM: "", PhaseVFIO: ReasonVFIOModulesMissing, PhaseGPU: ""},
		},
		{
			name: "intel and aspeed display, mellanox link down",
			host: fakeHost{
				osrelease: "6.1.0", meminfo: gpuHostMeminfo, modules: strPtr(""), kvm: true,
				sysModules: []string{"vfio", "vfio_pci", "vfio_iommu_type1"},
				pci: []fakePCI{
					{addr: "0000:00:02.0", vendor: "0x8086", device: "0x56a0", class: "0x030000"},
					{addr: "0000:00:02.1", vendor: "0x8086", device: "0x4905", class: "0x038000"},
					{addr: "0000:00:1f.3", vendor: "0x8086", device: "0x51c8", class: "0x040300"},
					{addr: "0000:02:00.0", vendor: "0x1a03", device: "0x2000", class: "0x030000"},
					{addr: "0000:03:00.0", vendor: "0x1002", device: "0x74a1", class: "0x038000", numa: "-1"},
					{addr: "0000:04:00.0", vendor: "0x15b3", device: "0x101d", class: "0x020000", numa: "0",
						nets: []fakeNet{{name: "ens1f1", operstate: "down", speed: "-1"}, {name: "ens1f0", operstate: "up", speed: "25000"}}},
					{addr: "0000:04:00.2", vendor: "0x15b3", device: "0xa2d6", class: "0x060400"},
					{addr: "0000:05:00.0", vendor: "0x15b3", device: "0x101d", class: "0x020000", driver: "vfio-pci"},
					{addr: "0000:06:00.0", vendor: "garbage", device: "0x0", class: "0x030000"},
				},
			},
			goos: "linux", wantKernel: "6.1.0",
			wantMemMB: [3]int{515899, 390625, 488281},
			wantGPUs:  []string{"0000:00:02.0", "0000:00:02.1", "0000:03:00.0"},
			wantFabric: []FabricLink{
				{PCIAddress: "0000:04:00.0", Device: "0x101d", NUMANode: 0, Interface: "ens1f0", OperState: "up", SpeedMbps: 25000, Up: true},
				{PCIAddress: "0000:04:00.0", Device: "0x101d", NUMANode: 0, Interface: "ens1f1", OperState: "down"},
				{PCIAddress: "0000:05:00.0", Device: "0x101d", NUMANode: -1, Driver: "vfio-pci"},
			},
			wantKVM:     KVMStatus{Present: true, Openable: true},
			wantVFIO:    map[string]bool{"vfio": true, "vfio_pci": true, "vfio_iommu_type1": true},
			wantReasons: map[string]string{PhaseFabric: ReasonFabricLinkDown, PhaseGPU: "", PhaseVFIO: ""},
		},
		{
			name:     "non-linux: linux-only checks not applicable",
			host:     fakeHost{noPCIDir: true},
			goos:     "windows",
			wantGPUs: []string{}, wantFabric: []FabricLink{},
			wantVFIO: map[string]bool{},
			wantReasons: map[string]string{PhaseKVM: ReasonNotApplicable, PhaseVFIO: ReasonNotApplicable,
				PhaseGPU: ReasonNotApplicable, PhaseFabric: ReasonNotApplicable, PhaseKernel: "", PhaseMemory: ""},
			wantHealthy: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			roots := tc.host.build(t)
			p := newTestProber(t, roots, tc.goos)
			p.cfg.OtherAccel = tc.otherAccel
			rep, err := p.Probe(context.Background(), Params{}, nil)
			if err != nil {
				t.Fatalf("Probe: %v", err)
			}
			if tc.wantKernel != "" && rep.KernelVersion != tc.wantKernel {
				t.Errorf("kernel = %q, want %q", rep.KernelVersion, tc.wantKernel)
			}
			if rep.KernelVersion == "" {
				t.Errorf("kernel version empty")
			}
			if tc.wantMemMB != [3]int{} {
				if got := [3]int{rep.MemTotalMB, rep.MemFreeMB, rep.MemAvailableMB}; got != tc.wantMemMB {
					t.Errorf("memory MB = %v, want %v", got, tc.wantMemMB)
				}
			}
			var gpus []string
			for _, d := range rep.GPUs.Devices {
				gpus = append(gpus, d.Address)
			}
			if gpus == nil {
				gpus = []string{}
			}
			if !reflect.DeepEqual(gpus, tc.wantGPUs) || rep.GPUs.Count != len(tc.wantGPUs) {
				t.Errorf("gpus = %d %v, want %v", rep.GPUs.Count, gpus, tc.wantGPUs)
			}
			if !reflect.DeepEqual(rep.Fabric, tc.wantFabric) {
				t.Errorf("fabric = %+v\nwant %+v", rep.Fabric, tc.wantFabric)
			}
			if tc.goos == "linux" {
				want := tc.wantKVM
				want.Path = filepath.Join(roots.dev, "kvm")
				got := rep.KVM
				got.Error = ""
				if got != want {
					t.Errorf("kvm = %+v, want %+v", rep.KVM, want)
				}
			}
			if !reflect.DeepEqual(rep.VFIO.Modules, tc.wantVFIO) {
				t.Errorf("vfio = %v, want %v", rep.VFIO.Modules, tc.wantVFIO)
			}
			checks := checksByName(rep)
			if len(rep.Checks) != 8 {
				t.Errorf("got %d checks, want 8", len(rep.Checks))
			}
			for name, reason := range tc.wantReasons {
				c := checks[name]
				wantOK := reason == "" || reason == ReasonNotApplicable
				if c.Reason != reason || c.OK != wantOK {
					t.Errorf("check %s = %+v, want reason %q ok %v", name, c, reason, wantOK)
				}
			}
			if rep.Healthy != tc.wantHealthy {
				t.Errorf("healthy = %v, want %v (checks %+v)", rep.Healthy, tc.wantHealthy, rep.Checks)
			}
			for _, ph := range []string{PhaseKernel, PhaseMemory, PhaseKVM, PhaseVFIO, PhaseGPU, PhaseFabric, PhaseRootFS, PhaseDiagnosticPath} {
				if _, ok := rep.Timings[ph+"_ms"]; !ok {
					t.Errorf("no timing for %s", ph)
				}
			}
		})
	}
}

func TestRootFS(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name       string
		u          fsUsage
		err        error
		wantReason string
		wantFull   bool
		wantPct    float64
	}{
		{"healthy", fsUsage{total: 100 * gib, used: 40 * gib, free: 60 * gib}, nil, "", false, 40},
		{"97.99% is not full", fsUsage{total: 10000 * gib, used: 9799 * gib, free: 201 * gib}, nil, "", false, 97.99},
		{"98% used is full", fsUsage{total: 100 * gib, used: 98 * gib, free: 2 * gib}, nil, ReasonDiskFull, true, 98},
		{"completely full", fsUsage{total: 100 * gib, used: 100 * gib}, nil, ReasonDiskFull, true, 100},
		{"under 100 MiB free on a small fs", fsUsage{total: 1 * gib, used: 1024*mib - 99*mib, free: 99 * mib}, nil, ReasonDiskFull, true, 90.33},
		{"statfs fails", fsUsage{}, errors.New("statfs: input/output error"), ReasonRootFSUnavailable, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProber(Config{RootPath: "/data", DefaultDiagnosticPath: t.TempDir(), GOOS: "linux"})
			p.statFS = func(_ context.Context, path string) (fsUsage, error) {
				if path != "/data" {
					t.Errorf("statFS path = %q", path)
				}
				return tc.u, tc.err
			}
			rep, err := p.Probe(context.Background(), Params{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			c := checksByName(rep)[PhaseRootFS]
			if c.Reason != tc.wantReason || c.OK != (tc.wantReason == "") {
				t.Errorf("check = %+v, want reason %q", c, tc.wantReason)
			}
			if rep.RootFS.Full != tc.wantFull || rep.RootFS.UsedPercent != tc.wantPct || rep.RootFS.Path != "/data" {
				t.Errorf("root_fs = %+v, want full=%v pct=%v", rep.RootFS, tc.wantFull, tc.wantPct)
			}
			if tc.wantFull && !strings.Contains(c.Detail, "full") {
				t.Errorf("detail %q does not say full", c.Detail)
			}
		})
	}
}

func TestDiagnosticPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	noSpace := func(string) error {
		return fmt.Errorf("write probe file: %w", &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC})
	}
	tests := []struct {
		name       string
		def, param string
		writer     func(string) error
		wantPath   string
		wantReason string
		wantErr    string
	}{
		{"default state dir", dir, "", nil, dir, "", ""},
		{"param overrides default", "/nonexistent-default", dir + "/", nil, dir, "", ""},
		{"unset", "", "", nil, "", ReasonDiagnosticPathUnset, "no diagnostic path configured"},
		{"relative", "", "relative/dir", nil, "relative/dir", ReasonDiagnosticPathInvalid, "diagnostic path must be absolute"},
		{"missing dir", "", filepath.Join(dir, "missing"), nil, filepath.Join(dir, "missing"), ReasonDiagnosticPathNotWritable, "no such directory"},
		{"not a dir", "", file, nil, file, ReasonDiagnosticPathNotWritable, "not a directory"},
		{"disk full", dir, "", noSpace, dir, ReasonDiagnosticPathNotWritable, "no space left on device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProber(Config{DefaultDiagnosticPath: tc.def, GOOS: "linux"})
			p.statFS = okFS
			if tc.writer != nil {
				p.writeProbe = tc.writer
			}
			rep, err := p.Probe(context.Background(), Params{DiagnosticPath: tc.param}, nil)
			if err != nil {
				t.Fatal(err)
			}
			c := checksByName(rep)[PhaseDiagnosticPath]
			d := rep.DiagnosticPath
			if c.Reason != tc.wantReason || c.OK != (tc.wantReason == "") || d.Writable != (tc.wantReason == "") {
				t.Errorf("check = %+v status = %+v, want reason %q", c, d, tc.wantReason)
			}
			if d.Path != tc.wantPath || d.Error != tc.wantErr {
				t.Errorf("status = %+v, want path %q error %q", d, tc.wantPath, tc.wantErr)
			}
		})
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".drover-health-*"))
	if len(leftovers) != 0 {
		t.Errorf("probe files left behind: %v", leftovers)
	}
}

func TestProbeProgressAndTimings(t *testing.T) {
	roots := fakeHost{osrelease: "6.8.0", meminfo: gpuHostMeminfo}.build(t)
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := NewProber(Config{SysRoot: roots.sys, ProcRoot: roots.proc, DevRoot: roots.dev, GOOS: "linux",
		DefaultDiagnosticPath: t.TempDir(),
		Now:                   func() time.Time { clock = clock.Add(5 * time.Millisecond); return clock }})
	p.statFS = okFS
	type call struct {
		phase  string
		d      time.Duration
		reason string
	}
	var calls []call
	rep, err := p.Probe(context.Background(), Params{}, func(phase string, d time.Duration, err error) {
		c := call{phase: phase, d: d}
		var ce *CheckError
		if errors.As(err, &ce) {
			c.reason = ce.Check.Reason
		} else if err != nil {
			t.Errorf("progress err %v is not a *CheckError", err)
		}
		calls = append(calls, c)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []call{
		{PhaseKernel, 5 * time.Millisecond, ""}, {PhaseMemory, 5 * time.Millisecond, ""},
		{PhaseKVM, 5 * time.Millisecond, ReasonKVMMissing}, {PhaseVFIO, 5 * time.Millisecond, ""}, // no GPU: not_applicable
		{PhaseGPU, 5 * time.Millisecond, ""}, {PhaseFabric, 5 * time.Millisecond, ""},
		{PhaseRootFS, 5 * time.Millisecond, ""}, {PhaseDiagnosticPath, 5 * time.Millisecond, ""},
	}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("progress calls = %+v\nwant %+v", calls, want)
	}
	if rep.Timings["kvm_ms"] != 5 || len(rep.Timings) != 8 {
		t.Errorf("timings = %v", rep.Timings)
	}
	rt := rep.ResultTimings()
	if rt["timings.root_fs_ms"] != 5 || len(rt) != 8 {
		t.Errorf("result timings = %v", rt)
	}
}

func TestProbeCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p := NewProber(Config{DefaultDiagnosticPath: t.TempDir()})
	rep, err := p.Probe(ctx, Params{}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if len(rep.Checks) != 8 || rep.Healthy {
		t.Fatalf("report = %+v", rep)
	}
	for _, c := range rep.Checks {
		if c.Reason != ReasonCanceled {
			t.Errorf("check %+v not canceled", c)
		}
	}
}

func TestPhaseTimeoutAndPanic(t *testing.T) {
	hung := make(chan struct{})
	defer close(hung)
	p := NewProber(Config{DefaultDiagnosticPath: t.TempDir(), PhaseTimeout: 50 * time.Millisecond})
	p.statFS = func(context.Context, string) (fsUsage, error) { <-hung; return fsUsage{}, nil } // a hung mount ignores ctx
	p.writeProbe = func(string) error { panic("boom") }
	start := time.Now()
	rep, err := p.Probe(context.Background(), Params{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("probe took %s despite the phase timeout", el)
	}
	c := checksByName(rep)
	if c[PhaseRootFS].Reason != ReasonTimeout || c[PhaseDiagnosticPath].Reason != ReasonInternalError {
		t.Errorf("checks = %+v", rep.Checks)
	}
}

func TestDecodeParams(t *testing.T) {
	tests := []struct {
		raw     string
		want    Params
		wantErr bool
	}{
		{"", Params{}, false},
		{"null", Params{}, false},
		{"{}", Params{}, false},
		{`{"diagnostic_path":"/var/lib/drover"}`, Params{DiagnosticPath: "/var/lib/drover"}, false},
		{`{"diagnostic_path":"var/lib"}`, Params{}, true},
		{`{"diagnostic_path":"/x","extra":1}`, Params{}, true},
		{`[1]`, Params{}, true},
	}
	for _, tc := range tests {
		got, err := DecodeParams(json.RawMessage(tc.raw))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("DecodeParams(%q) = %+v, %v; want %+v, err %v", tc.raw, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestHandle(t *testing.T) {
	roots := fakeHost{osrelease: "6.8.0", meminfo: gpuHostMeminfo, noPCIDir: true}.build(t)
	p := newTestProber(t, roots, "linux")
	res, err := p.Handle(context.Background(), json.RawMessage(`{}`), nil)
	if err != nil || res.Status != "succeeded" {
		t.Fatalf("Handle = %+v, %v", res, err)
	}
	var rep Report
	if err := json.Unmarshal(res.Output, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.KernelVersion != "6.8.0" || len(rep.Checks) != 8 {
		t.Errorf("output = %+v", rep)
	}
	if _, ok := res.Timings["timings.diagnostic_path_ms"]; !ok {
		t.Errorf("timings = %v", res.Timings)
	}
	var raw map[string]any
	_ = json.Unmarshal(res.Output, &raw)
	for _, k := range []string{"kernel_version", "mem_available_mb", "kvm", "vfio", "gpus", "fabric", "root_fs", "diagnostic_path", "checks", "timings"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("output lacks %q", k)
		}
	}

	res, err = p.Handle(context.Background(), json.RawMessage(`{"diagnostic_path":"rel"}`), nil)
	if err == nil || res.Status != "failed" || res.Error == nil || res.Error.Code != "invalid_params" {
		t.Errorf("bad params: %+v, %v", res, err)
	}
}
