package hostinfo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"

	"github.com/drover-dev/drover/internal/node/hostinfo/hostinfotest"
	"github.com/drover-dev/drover/internal/wire/api"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json")

const twoSocketCPUInfo = `processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 0
core id		: 0
flags		: fpu vme de pse tsc msr vmx ept

processor	: 1
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 0
core id		: 1
flags		: fpu vme de pse tsc msr vmx ept

processor	: 2
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 1
core id		: 0
flags		: fpu vme de pse tsc msr vmx ept

processor	: 3
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 1
core id		: 0
flags		: fpu vme de pse tsc msr vmx ept
`

const gpuMeminfo = `MemTotal:       2113126400 kB
MemFree:        2000000000 kB
MemAvailable:   2100000000 kB
SwapTotal:             0 kB
`

// smiCanned is nvidia-smi's answer on the fake GPU host.
const smiCanned = `0, NVIDIA H100 80GB HBM3, 81559, 550.54.15, GPU-11111111-2222-3333-4444-555555555555, 00000000:3B:00.0
1, NVIDIA H100 80GB HBM3, 81559, 550.54.15, GPU-66666666-7777-8888-9999-000000000000, 00000000:86:00.0
`

func gpuHost() hostinfotest.Host {
	return hostinfotest.Host{
		CPUInfo: twoSocketCPUInfo, Meminfo: gpuMeminfo, Kernel: "6.8.0-45-generic",
		Topology: []hostinfotest.CPU{{Package: "0", Core: "0"}, {Package: "0", Core: "1"}, {Package: "1", Core: "0"}, {Package: "1", Core: "0"}},
		NUMA:     []hostinfotest.NUMANode{{ID: "0", CPUList: "0-1", MemTotalKB: "1056563200"}, {ID: "1", CPUList: "2-3", MemTotalKB: "1056563200"}},
		Mounts: "/dev/vda1 / ext4 rw 0 0\nproc /proc proc rw 0 0\ntmpfs /run tmpfs rw 0 0\n" +
			"/dev/nvme0n1p1 /data\\040disk ext4 rw 0 0\n/dev/vda1 / ext4 rw 0 0\n",
		Files: map[string]string{"etc/os-release": "NAME=\"Ubuntu\"\nPRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\n"},
		PCI: []hostinfotest.PCI{
			{Addr: "0000:00:00.0", Vendor: "0x8086", Device: "0x09a2", Class: "0x060000", NUMA: "0", IOMMUGroup: "0"},
			{Addr: "0000:00:03.0", Vendor: "0x1af4", Device: "0x1001", Class: "0x010000", NUMA: "0", Driver: "virtio-pci", IOMMUGroup: "1"},
			{Addr: "0000:3b:00.0", Vendor: "0x10de", Device: "0x2330", Class: "0x030200", NUMA: "0", Driver: "nvidia", IOMMUGroup: "10"},
			{Addr: "0000:3b:00.1", Vendor: "0x10de", Device: "0x22a3", Class: "0x040300", NUMA: "0", IOMMUGroup: "10"},
			{Addr: "0000:5e:00.0", Vendor: "0x144d", Device: "0xa824", Class: "0x010802", NUMA: "0", Driver: "nvme", IOMMUGroup: "30"},
			{Addr: "0000:86:00.0", Vendor: "0x10de", Device: "0x2330", Class: "0x030200", NUMA: "1", Driver: "nvidia", IOMMUGroup: "11"},
			{Addr: "0000:af:00.0", Vendor: "0x15b3", Device: "0x1021", Class: "0x020700", NUMA: "1", Driver: "mlx5_core", IOMMUGroup: "20",
				SRIOVTotalVFs: "8", SRIOVNumVFs: "2", VFs: []string{"0000:af:00.2", "0000:af:00.3"},
				Nets: []hostinfotest.Net{{Name: "ibp175s0", OperState: "up", Speed: "400000", Type: "32", MTU: "4092",
					Address: "00:00:10:49:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01"}}},
			{Addr: "0000:af:00.2", Vendor: "0x15b3", Device: "0x101e", Class: "0x020700", NUMA: "1", Driver: "vfio-pci", IOMMUGroup: "21", PhysFn: "0000:af:00.0"},
			{Addr: "0000:af:00.3", Vendor: "0x15b3", Device: "0x101e", Class: "0x020700", NUMA: "1", IOMMUGroup: "22", PhysFn: "0000:af:00.0"},
			{Addr: "0000:c1:00.0", Vendor: "0x8086", Device: "0x159b", Class: "0x020000", NUMA: "1", Driver: "ice", IOMMUGroup: "40",
				Nets: []hostinfotest.Net{{Name: "ens1f0", OperState: "down", Speed: "-1", Address: "b4:96:91:00:00:01", MTU: "1500"}}},
		},
		Block: []hostinfotest.Block{
			{Name: "nvme0n1", Controller: "nvme0", PCIAddr: "0000:5e:00.0", Sectors: "7501476528", Model: "SAMSUNG MZWLR3T8HBLS-00007",
				Serial: "S6EUNE0R100001", Rotational: "0", Removable: "0", Partitions: []string{"nvme0n1p1"},
				ByID: []string{"nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EUNE0R100001", "nvme-eui.36344730526000010025384500000001"}},
			{Name: "vda", PCIAddr: "0000:00:03.0", Sectors: "41943040", Rotational: "1", Removable: "0", Partitions: []string{"vda1"},
				ByID: []string{"virtio-root"}},
			{Name: "loop0", Sectors: "100"},
		},
		Virtual: []hostinfotest.Net{{Name: "br-slice", OperState: "unknown", Address: "02:00:00:00:00:01", MTU: "1500"},
			{Name: "lo", OperState: "unknown", Type: "772"}},
	}
}

func fakeStatFS(_ context.Context, path string) (FSUsage, error) {
	switch path {
	case "/":
		return FSUsage{Total: 40 << 30, Used: 10 << 30, Free: 28 << 30}, nil
	case "/data disk":
		return FSUsage{Total: 3500 << 30, Used: 700 << 30, Free: 2800 << 30}, nil
	}
	return FSUsage{}, fmt.Errorf("statfs %s: no such file or directory", path)
}

// smiRunner answers nvidia-smi with out/err and fails on anything else.
func smiRunner(t *testing.T, out string, err error) Runner {
	return func(_ context.Context, name string, args ...string) ([]byte, error) {
		if name != "nvidia-smi" || strings.Join(args, " ") != strings.Join(NvidiaSMIArgs(), " ") {
			t.Errorf("unexpected command %s %v", name, args)
		}
		return []byte(out), err
	}
}

func noRunner(t *testing.T) Runner {
	return func(_ context.Context, name string, args ...string) ([]byte, error) {
		t.Errorf("no command should run; ran %s %v", name, args)
		return nil, exec.ErrNotFound
	}
}

func testConfig(r hostinfotest.Roots, run Runner, pciIDs string) Config {
	return Config{
		SysRoot: r.Sys, ProcRoot: r.Proc, DevRoot: r.Dev, EtcRoot: r.Etc, DataRoot: r.Root, PCIIDsPath: pciIDs,
		GOOS: "linux", GOARCH: "amd64", Getenv: func(string) string { return "" }, Run: run, StatFS: fakeStatFS,
		NVML:     func(context.Context) ([]NVIDIAGPU, error) { return nil, ErrNVMLNotBuilt },
		Hostname: func() (string, error) { return "host-01", nil },
		Now:      func() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) },
	}
}

// TestCollectFakeHosts compares Collect's output on fake trees with golden
// files; run with -update to rewrite them after a deliberate change.
func TestCollectFakeHosts(t *testing.T) {
	smiMissing := fmt.Errorf("nvidia-smi: %w", exec.ErrNotFound)
	tests := []struct {
		name   string
		host   hostinfotest.Host
		run    func(t *testing.T) Runner
		pciIDs string
	}{
		{"gpu_host", gpuHost(), func(t *testing.T) Runner { return smiRunner(t, smiCanned, nil) }, "testdata/pci.ids"},
		{"gpu_host_no_pci_ids_no_smi", gpuHost(), func(t *testing.T) Runner { return smiRunner(t, "", smiMissing) }, ""},
		{"small_vm", hostinfotest.Host{
			CPUInfo: "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu svm hypervisor\n\n" +
				"processor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu svm hypervisor\n",
			Meminfo: "MemTotal: 2097152 kB\nMemFree: 1048576 kB\nBuffers: 0 kB\nCached: 524288 kB\n",
			Kernel:  "5.15.0", Mounts: "overlay / overlay rw 0 0\n", NoPCIDir: true,
		}, noRunner, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.host.Build(t)
			inv, err := Collect(context.Background(), testConfig(r, tc.run(t), tc.pciIDs))
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(inv, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			testutil.CheckGolden(t, filepath.Join("testdata", tc.name+".golden.json"), append(got, '\n'), *update)
		})
	}
}

// TestCollectNonLinux: without sysfs the GPU list is what nvidia-smi says.
func TestCollectNonLinux(t *testing.T) {
	cfg := testConfig(hostinfotest.Host{}.Build(t), smiRunner(t, smiCanned, nil), "")
	cfg.GOOS, cfg.StatFS = "windows", FSUsageOf
	inv, err := Collect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if inv.OS.Family != api.OSWindows || len(inv.GPUs) != 2 {
		t.Fatalf("inventory = %+v", inv)
	}
	g := inv.GPUs[1]
	if g.Address != "0000:86:00.0" || g.Vendor != "nvidia" || g.MemoryMiB != 81559 || g.NUMANode != -1 ||
		g.Index == nil || *g.Index != 1 || g.DetailSource != "nvidia-smi" || g.IOMMUGroup != nil {
		t.Errorf("gpu = %+v", g)
	}
}

func TestCollectCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := gpuHost().Build(t)
	_, err := Collect(ctx, testConfig(r, smiRunner(t, smiCanned, nil), ""))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// TestCollectHungMount: a statfs that never returns costs that
// filesystem, with a warning, not the inventory.
func TestCollectHungMount(t *testing.T) {
	hung := make(chan struct{})
	defer close(hung)
	h := hostinfotest.Host{Meminfo: gpuMeminfo, CPUInfo: twoSocketCPUInfo, Kernel: "6.8.0", NoPCIDir: true,
		Mounts: "/dev/vda1 / ext4 rw 0 0\nnfs:/export /mnt/nfs nfs4 rw 0 0\n"}
	cfg := testConfig(h.Build(t), noRunner(t), "")
	cfg.StatFSTimeout = 50 * time.Millisecond
	cfg.StatFS = func(ctx context.Context, path string) (FSUsage, error) {
		if path == "/mnt/nfs" {
			<-hung // a hung NFS server ignores ctx
		}
		return fakeStatFS(ctx, path)
	}
	start := time.Now()
	inv, err := Collect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Collect took %s", el)
	}
	if len(inv.Filesystems) != 1 || inv.Filesystems[0].MountPoint != "/" {
		t.Errorf("filesystems = %+v", inv.Filesystems)
	}
	if len(inv.Warnings) != 1 || inv.Warnings[0].Section != "filesystems" || !strings.Contains(inv.Warnings[0].Message, "/mnt/nfs") {
		t.Errorf("warnings = %+v", inv.Warnings)
	}
}
