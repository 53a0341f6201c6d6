package slicevm

// Fake hosts (hostinfotest trees, the shapes of internal/node/slice's fixtures),
// a mock runtime wrapper and the test environment.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/hostinfo/hostinfotest"
	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/task"
)

const (
	gpuAddr   = "0000:18:00.0"
	vfAddr    = "0000:1a:00.2"
	slotMAC   = "02:aa:00:00:00:01"
	slotIP    = "10.77.0.10"
	nvmeByID  = "nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EUNE0R000000"
	nvmeBytes = 8 << 20
	imgBytes  = 4 << 20
)

// gpu is an NVIDIA H100 SXM function bound to driver.
func gpu(addr, driver, group string) hostinfotest.PCI {
	return hostinfotest.PCI{Addr: addr, Vendor: "0x10de", Device: "0x2330", Class: "0x030200", NUMA: "0",
		Driver: driver, IOMMUGroup: group}
}

// sliceHost has one slot's worth of hardware: a GPU and a ConnectX-7 VF
// bound to vfio-pci, an NVMe namespace (nvme0n1, free) next to the OS disk
// (nvme8n1, mounted), KVM, and the br-slice OVS bridge.
func sliceHost() hostinfotest.Host {
	h := hostinfotest.Host{
		KVM:     true,
		CPUInfo: "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vmx ept\n",
		Cmdline: "BOOT_IMAGE=/vmlinuz root=/dev/nvme8n1p2 intel_iommu=on iommu=pt",
		Modules: hostinfotest.Ptr("vfio_pci 16384 0 - Live 0x0\nvfio_iommu_type1 16384 0 - Live 0x0\nvfio 16384 0 - Live 0x0\n"),
		Mounts:  "/dev/nvme8n1p2 / ext4 rw 0 0\n",
		Virtual: []hostinfotest.Net{
			{Name: "br-slice", OperState: "unknown", Address: "02:00:00:00:00:01", MTU: "1500"},
			{Name: "ovs-system", OperState: "down", Address: "02:00:00:00:00:02", MTU: "1500"},
		},
		Files: map[string]string{
			"proc/self/mountinfo": "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme8n1p2 rw\n" +
				"23 22 0:21 / /proc rw - proc proc rw\n",
			"proc/swaps": "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
		},
	}
	h.PCI = append(h.PCI,
		gpu(gpuAddr, "vfio-pci", "20"),
		hostinfotest.PCI{Addr: "0000:19:00.0", Vendor: "0x144d", Device: "0xa824", Class: "0x010802", NUMA: "0",
			Driver: "nvme", IOMMUGroup: "30"},
		hostinfotest.PCI{Addr: "0000:05:00.0", Vendor: "0x144d", Device: "0xa824", Class: "0x010802", NUMA: "0",
			Driver: "nvme", IOMMUGroup: "38"},
		hostinfotest.PCI{Addr: "0000:1a:00.0", Vendor: "0x15b3", Device: "0x1021", Class: "0x020700", NUMA: "0",
			Driver: "mlx5_core", IOMMUGroup: "40", SRIOVTotalVFs: "16", SRIOVNumVFs: "1", VFs: []string{vfAddr}},
		hostinfotest.PCI{Addr: vfAddr, Vendor: "0x15b3", Device: "0x101e", Class: "0x020700", NUMA: "0",
			Driver: "vfio-pci", IOMMUGroup: "41", PhysFn: "0000:1a:00.0"},
	)
	ns := func(n int, ctrl string, parts ...string) hostinfotest.Block {
		serial := fmt.Sprintf("S6EUNE0R%06d", n)
		return hostinfotest.Block{Name: fmt.Sprintf("nvme%dn1", n), Controller: fmt.Sprintf("nvme%d", n), PCIAddr: ctrl,
			Sectors: "7501476528", Model: "SAMSUNG MZWLR3T8HBLS-00007", Serial: serial, Rotational: "0", Removable: "0",
			Partitions: parts, ByID: []string{"nvme-SAMSUNG_MZWLR3T8HBLS-00007_" + serial}}
	}
	h.Block = []hostinfotest.Block{ns(0, "0000:19:00.0"), ns(8, "0000:05:00.0", "nvme8n1p1", "nvme8n1p2")}
	return h
}

// gpu2Addr is the second GPU of twoGPUHost.
const gpu2Addr = "0000:2a:00.0"

// twoGPUHost is sliceHost with a second GPU (slot 1: no NVMe or VF left).
func twoGPUHost() hostinfotest.Host {
	h := sliceHost()
	h.PCI = append(h.PCI, gpu(gpu2Addr, "vfio-pci", "21"))
	return h
}

// stopRecorder is the mock runtime with Stop's graceful timeout scaled
// down 1000x (so a 30 s timeout the guest ignores takes 30 ms); it records
// the timeouts asked for.
type stopRecorder struct {
	*mock.Runtime
	mu       sync.Mutex
	graceful []time.Duration
}

func (s *stopRecorder) Stop(ctx context.Context, id string, graceful time.Duration) (runtime.StopResult, error) {
	s.mu.Lock()
	s.graceful = append(s.graceful, graceful)
	s.mu.Unlock()
	return s.Runtime.Stop(ctx, id, graceful/1000)
}

// env is one provisioner over a fake host.
type env struct {
	p        *Provisioner
	rt       *stopRecorder
	roots    hostinfotest.Roots
	state    string
	ciDir    string
	imgPath  string // qcow2 (or raw, without qemu-img) base image
	imgSHA   string
	rawImage []byte // the image's guest-visible bytes
	nvme     string // by-id path of the slot's NVMe (a regular file)
	nvmeFile string // the file it resolves to
}

type envOpts struct {
	host     hostinfotest.Host
	lookPath func(string) (string, error)
	accel    func(context.Context, string) error
	qcow2    bool // build a qcow2 image (needs qemu-img)
	bare     bool // a host with no GPU, NVMe or bridge
	install  bool // Options.InstallDependencies
}

// needQEMUImg skips without qemu-img, but fails under CI=true.
func needQEMUImg(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("qemu-img is required under CI=true: %v", err)
		}
		t.Skipf("qemu-img not installed: %v", err)
	}
	return p
}

// lookPathWith finds qemu-img for real and pretends every other command is
// installed under /usr/bin, except missing ones.
func lookPathWith(missing ...string) func(string) (string, error) {
	return func(name string) (string, error) {
		for _, m := range missing {
			if m == name {
				return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
			}
		}
		if name == "qemu-img" {
			if p, err := exec.LookPath(name); err == nil {
				return p, nil
			}
		}
		return "/usr/bin/" + name, nil
	}
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	if o.host.PCI == nil && !o.host.KVM && !o.bare {
		o.host = sliceHost()
	}
	if o.lookPath == nil {
		o.lookPath = lookPathWith()
	}
	e := &env{roots: o.host.Build(t)}
	base := t.TempDir()
	e.state, e.ciDir = filepath.Join(base, "state"), filepath.Join(base, "slices")
	images := filepath.Join(base, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	e.rawImage = bytes.Repeat([]byte("drover-slice-image-"), imgBytes/19+1)[:imgBytes]
	raw := filepath.Join(images, "base.raw")
	writeFile(t, raw, e.rawImage)
	e.imgPath = raw
	if o.qcow2 {
		e.imgPath = filepath.Join(images, "base.qcow2")
		if out, err := exec.Command(needQEMUImg(t), "convert", "-f", "raw", "-O", "qcow2", raw, e.imgPath).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img convert: %v: %s", err, out)
		}
	}
	e.imgSHA = fileSHA(t, e.imgPath)
	cache, err := image.NewCache(image.Options{Dir: filepath.Join(base, "cache"), AllowedDirs: []string{images},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.nvme = filepath.Join(e.roots.Dev, "disk", "by-id", nvmeByID)
	e.nvmeFile = filepath.Join(e.roots.Dev, "nvme0n1")
	if exists(e.nvmeFile) {
		writeFile(t, e.nvmeFile, bytes.Repeat([]byte{0xab}, nvmeBytes))
	}
	e.rt = &stopRecorder{Runtime: mock.New(mock.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})}
	e.p, err = New(Options{Runtime: e.rt, Images: cache, SysfsRoot: e.roots.Base, StateDir: e.state,
		CloudInitDir: e.ciDir, DeviceDirs: []string{e.roots.Dev}, LookPath: o.lookPath, CheckAccel: o.accel,
		InstallDependencies: o.install,
		Log:                 slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// slotParams are valid params for vm-1 with the fake host's slot, on the
// OVS bridge (tap networking: readiness is the serial marker alone).
func (e *env) slotParams() task.VMProvisionParams {
	return task.VMProvisionParams{AllocationID: "alloc-1", VMName: "vm-1", ImagePath: e.imgPath, ImageSHA256: e.imgSHA,
		SSHPublicKeys: []string{testSSHKey}, OVSBridge: "br-slice", ReadinessTimeoutSeconds: 5,
		Slots: []task.VMSlot{{SlotID: "slot-0", SlotIndex: 0, PCIAddress: gpuAddr, FabricDevice: vfAddr,
			NVMeDevice: e.nvme, VCPUCount: 4, MemoryMiB: 4096, MACAddress: slotMAC, PrivateIP: slotIP}}}
}

const testSSHKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOuQ4ruXNBrGJtrDdhNLziqmo76C7m8/YwZ8DYataZU8 op@example"

// sshServer accepts connections on 127.0.0.1 and greets each with an SSH
// banner (or, with banner "", closes it at once).
func sshServer(t *testing.T, banner string) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if banner != "" {
				_, _ = c.Write([]byte(banner + "\r\n"))
			}
			_ = c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// phaseLog records progress calls.
type phaseLog struct {
	mu    sync.Mutex
	names []string
	errs  map[string]error
}

func (l *phaseLog) progress(phase string, d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d < 0 {
		panic("negative duration for " + phase)
	}
	l.names = append(l.names, phase)
	if l.errs == nil {
		l.errs = map[string]error{}
	}
	l.errs[phase] = err
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
