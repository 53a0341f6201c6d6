package integration

// A slice host for the end-to-end tests: a real agent whose host is a fake
// one-slot GPU/NVMe/fabric topology (a hostinfotest tree) with a
// file-backed NVMe namespace, running the QEMU runtime under TCG.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/hostinfo/hostinfotest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// The fake slot's devices.
const (
	sliceGPU      = "0000:18:00.0"
	sliceVF       = "0000:1a:00.2"
	sliceNVMeByID = "nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EUNE0R000000"
	// sliceNVMeBytes is the file-backed namespace's size: the guest's
	// 64 MiB disk image is written onto it.
	sliceNVMeBytes = 80 << 20
)

// sliceHostFixture is one slot's worth of hardware, the shape of
// internal/node/slicevm's fixtures: an H100 and a ConnectX-7 VF bound to
// vfio-pci, a free NVMe namespace (nvme0n1) next to the mounted OS disk
// (nvme8n1), KVM and the vfio modules.
func sliceHostFixture() hostinfotest.Host {
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
		PCI: []hostinfotest.PCI{
			{Addr: sliceGPU, Vendor: "0x10de", Device: "0x2330", Class: "0x030200", NUMA: "0", Driver: "vfio-pci", IOMMUGroup: "20"},
			{Addr: "0000:19:00.0", Vendor: "0x144d", Device: "0xa824", Class: "0x010802", NUMA: "0", Driver: "nvme", IOMMUGroup: "30"},
			{Addr: "0000:05:00.0", Vendor: "0x144d", Device: "0xa824", Class: "0x010802", NUMA: "0", Driver: "nvme", IOMMUGroup: "38"},
			{Addr: "0000:1a:00.0", Vendor: "0x15b3", Device: "0x1021", Class: "0x020700", NUMA: "0", Driver: "mlx5_core",
				IOMMUGroup: "40", SRIOVTotalVFs: "16", SRIOVNumVFs: "1", VFs: []string{sliceVF}},
			{Addr: sliceVF, Vendor: "0x15b3", Device: "0x101e", Class: "0x020700", NUMA: "0", Driver: "vfio-pci",
				IOMMUGroup: "41", PhysFn: "0000:1a:00.0"},
		},
	}
	ns := func(n int, ctrl string, parts ...string) hostinfotest.Block {
		serial := fmt.Sprintf("S6EUNE0R%06d", n)
		return hostinfotest.Block{Name: fmt.Sprintf("nvme%dn1", n), Controller: fmt.Sprintf("nvme%d", n), PCIAddr: ctrl,
			Sectors: fmt.Sprint(sliceNVMeBytes / 512), Model: "SAMSUNG MZWLR3T8HBLS-00007", Serial: serial, Rotational: "0",
			Removable: "0", Partitions: parts, ByID: []string{"nvme-SAMSUNG_MZWLR3T8HBLS-00007_" + serial}}
	}
	h.Block = []hostinfotest.Block{ns(0, "0000:19:00.0"), ns(8, "0000:05:00.0", "nvme8n1p1", "nvme8n1p2")}
	return h
}

// noVFIO is the QEMU runtime with the VMs' PCI passthrough devices left
// out: the fixture's GPU and VF do not exist, and VFIO needs KVM, which
// these tests do not use. Everything else (the NVMe boot disk, the seed,
// user networking, the serial console) is QEMU's own. The real VFIO path
// runs only on a GPU host (docs/runbooks/slices.md).
type noVFIO struct{ *qemu.Runtime }

func (r noVFIO) Create(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	spec.Devices.PCI = nil
	return r.Runtime.Create(ctx, spec)
}

// noVFIOEntry registers noVFIO under the qemu runtime's name and
// settings; boot devices may be the fixture's (devDir/disk/by-id,
// devDir/nvme*) instead of the host's /dev. It runs without memory
// cgroups, as every agent of these tests does.
func noVFIOEntry(devDir string) runtime.Entry {
	return runtime.WithConfig(qemu.ParseConfig, func(ctx context.Context, o runtime.Options, c qemu.Config) (runtime.Runtime, error) {
		if o.Accel == "" {
			return nil, errors.New("no working accelerator for QEMU")
		}
		rt, err := qemu.New(ctx, qemu.Options{Root: o.Root, Images: o.Images, Accel: o.Accel, QEMUBinary: c.Binary,
			OnOrphanRemoved: o.OnOrphanRemoved, Log: o.Log,
			DeviceDirs: []string{filepath.Join(devDir, "disk", "by-id"), filepath.Join(devDir, "nvme")}})
		if err != nil {
			return nil, err
		}
		return noVFIO{rt}, nil
	}, qemu.Settings()...)
}

// sliceNode is a slice host: the fixture tree, the guest (qemutest with
// sshd), and an in-process agent that can be stopped and started again
// on the same state and runtime directories.
type sliceNode struct {
	t        *testing.T
	id       string
	g        qemutest.Guest
	roots    hostinfotest.Roots
	nvme     string // the file the slot's NVMe by-id link resolves to
	rtDir    string
	stateDir string
	imgDirs  string
	token    string
	stop     func()
	o        sliceNodeOpts
	logPath  string // agentBin's log (stdout and stderr, every run)
}

// sliceNodeOpts vary a slice host.
type sliceNodeOpts struct {
	// tune edits the agent's configuration after the slice host's own
	// settings (NODE_AGENT_SLICE_CIDR, ...), at each start.
	tune func(*agent.Config)
	// linuxBridge makes the fixture's br-slice a Linux bridge (the one
	// the agent makes with NODE_AGENT_SLICE_CIDR): discovery's notice
	// ovs_bridge_not_ovs is expected.
	linuxBridge bool
	// agentBin runs the agent as this drover-agent binary, a child
	// process reading the fixture tree through NODE_AGENT_HOST_ROOT (so
	// with the QEMU runtime as it is: the VM's VFIO devices go to QEMU,
	// which cannot open the fixture's), instead of in-process; stop kills
	// it with SIGKILL. tune does not apply.
	agentBin string
	// env adds settings to agentBin's environment.
	env []string
}

// newSliceNode builds the host and its guest and starts its agent on e.
func newSliceNode(t *testing.T, e *env, id string) *sliceNode {
	t.Helper()
	return newSliceNodeWith(t, e, id, sliceNodeOpts{})
}

// newSliceNodeWith is newSliceNode varied by o.
func newSliceNodeWith(t *testing.T, e *env, id string, o sliceNodeOpts) *sliceNode {
	t.Helper()
	imgDir := t.TempDir()
	fx := sliceHostFixture()
	fx.Virtual[0].Bridge = o.linuxBridge
	n := &sliceNode{t: t, id: id, g: qemutest.BuildWith(t, imgDir, qemutest.Options{SSHD: true}),
		roots: fx.Build(t), rtDir: shortDir(t), stateDir: t.TempDir(), o: o}
	n.imgDirs = imgDir + "," + filepath.Dir(n.g.Kernel)
	n.nvme = filepath.Join(n.roots.Dev, "nvme0n1")
	// Not zero, so that the wipe on release shows.
	if err := os.WriteFile(n.nvme, bytes.Repeat([]byte{0xab}, sliceNVMeBytes), 0o600); err != nil {
		t.Fatal(err)
	}
	killGuests(t, n.rtDir)
	n.token = e.createHost(id).Token
	n.start(e)
	e.waitHostStatus(id, api.HostHealthy, 60*time.Second)
	return n
}

// shortDir is a temporary directory with a short path: the runtime's
// unix sockets must stay under 108 bytes, which t.TempDir's names (the
// test's name in them) can overrun.
func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "sl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// killGuests makes sure a failed test leaves no guest of rtDir running.
func killGuests(t *testing.T, rtDir string) {
	t.Cleanup(func() {
		for _, pid := range qemuProcesses(t, rtDir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// start runs the agent (again) against e's control plane.
func (n *sliceNode) start(e *env) {
	n.t.Helper()
	if n.o.agentBin != "" {
		n.startProc(e)
		return
	}
	_, n.stop = e.startAgent(n.id, n.token, agentOpts{runtime: qemu.Name, imageDirs: n.imgDirs, runtimeDir: n.rtDir,
		stateDir: n.stateDir, options: []agent.Option{agent.WithSliceHost(n.roots.Base, n.roots.Dev)},
		tune: func(c *agent.Config) {
			rs := runtime.Registry{}
			for k, v := range c.Runtimes {
				rs[k] = v
			}
			rs[qemu.Name] = noVFIOEntry(n.roots.Dev)
			c.Runtimes = rs
			if n.o.tune != nil {
				n.o.tune(c)
			}
		}})
}

// approveSlots runs slice.topology_discover on the agent (which reads the
// fixture tree, naming its devices below it) and approves every candidate
// through the operator's POST /api/v1/hosts/{id}/slots: discovery reports
// no host or slot blocker here (the seed's tools this machine lacks,
// virt-install, virsh, cloud-localds, ovs-vsctl and findmnt, are notices),
// so the approval route takes them.
func (n *sliceNode) approveSlots(e *env) []api.Slot {
	n.t.Helper()
	disc := e.enqueue(n.id, task.TypeTopologyDiscover, map[string]any{})
	done := e.waitTask(disc.ID, time.Minute)
	if done.State != api.TaskSucceeded {
		n.t.Fatalf("topology_discover %s: %+v\n%s", done.State, done.Result.Error, done.Result.Output)
	}
	var out struct {
		Candidates []json.RawMessage `json:"candidate_slots"`
		Summary    struct {
			Blockers []json.RawMessage `json:"blockers"`
			Notices  []struct {
				Code string `json:"code"`
			} `json:"notices"`
		} `json:"candidate_summary"`
	}
	if err := json.Unmarshal(done.Result.Output, &out); err != nil || len(out.Candidates) == 0 || len(out.Summary.Blockers) != 0 {
		n.t.Fatalf("topology_discover output (%v), want candidates and no blocker: %s", err, done.Result.Output)
	}
	for _, nt := range out.Summary.Notices {
		if !strings.HasPrefix(nt.Code, "command_absent:") && !(n.o.linuxBridge && nt.Code == "ovs_bridge_not_ovs") {
			n.t.Errorf("discovery notice %s", nt.Code)
		}
	}
	var approved []api.Slot
	if st := e.op(http.MethodPost, "/api/v1/hosts/"+n.id+"/slots", api.ApproveSlotsRequest{TaskID: disc.ID, All: true},
		&approved); st != http.StatusOK || len(approved) != len(out.Candidates) {
		n.t.Fatalf("approve the slots of %s: HTTP %d %+v", n.id, st, approved)
	}
	for _, sl := range approved {
		if sl.SourceTask != disc.ID || sl.ApprovedBy == "" || !strings.Contains(string(sl.Spec), `"`+n.roots.Dev+`/disk/by-id/`) {
			n.t.Fatalf("approved slot %+v: %s", sl, sl.Spec)
		}
	}
	return approved
}

// request is a slice allocation of one slot booting the guest directly
// (its kernel, initrd and readiness marker), for user with a key of its
// own.
func (n *sliceNode) request(user string) api.CreateAllocationRequest {
	g := n.g
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		n.t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		n.t.Fatal(err)
	}
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " " + user + "@laptop"
	return api.CreateAllocationRequest{Username: user, HostID: n.id, SSHAuthorizedKeys: []string{key}, SliceRequest: api.SliceRequest{Slots: 1,
		Image: "file://" + g.Disk, ImageSHA256: g.DiskSHA256, VCPUs: 1, MemoryMiB: 256,
		Boot: &api.DirectBoot{Kernel: api.Artifact{URL: "file://" + g.Kernel, SHA256: g.KernelSHA256},
			Initrd: &api.Artifact{URL: "file://" + g.Initrd, SHA256: g.InitrdSHA256}, Cmdline: g.Cmdline},
		ReadinessMarker: g.Marker, ReadinessTimeoutSeconds: 240}}
}

// files lists the names in one of the agent's runtime directories
// ("slices/dhcp-hosts.d", "slices/terminal", "cloud-init", ...).
func (n *sliceNode) files(rel string) []string {
	n.t.Helper()
	ents, err := os.ReadDir(filepath.Join(n.rtDir, rel))
	if err != nil && !os.IsNotExist(err) {
		n.t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// createSlice creates a slice allocation through the operator API.
func (e *env) createSlice(req api.CreateAllocationRequest) api.Allocation {
	e.t.Helper()
	var a api.Allocation
	if st := e.op(http.MethodPost, "/api/v1/allocations", req, &a); st != http.StatusCreated || a.Workflow == nil {
		e.t.Fatalf("create slice allocation: HTTP %d %+v", st, a)
	}
	return a
}

// followSlice reads the allocation as `drover allocations create --wait`
// does (GET, again and again) until done says it is done; each reading
// goes to seen first. It fails the test after within.
func (e *env) followSlice(id string, within time.Duration, seen func(api.Allocation), done func(api.Allocation) bool) api.Allocation {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var a api.Allocation
		if st := e.op(http.MethodGet, "/api/v1/allocations/"+id, nil, &a); st != http.StatusOK {
			e.t.Fatalf("get allocation %s: HTTP %d", id, st)
		}
		if seen != nil {
			seen(a)
		}
		if done(a) {
			return a
		}
		if time.Now().After(deadline) {
			raw, _ := json.MarshalIndent(a, "", "  ")
			e.t.Fatalf("allocation %s not done after %s:\n%s", id, within, raw)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// settled is done for followSlice: the allocation left provisioning and
// releasing.
func settled(a api.Allocation) bool {
	return a.State != api.AllocationProvisioning && a.State != api.AllocationReleasing
}

// noSliceLeftovers checks that nothing of a slice allocation is left: no
// slot lease in the store, no DHCP reservation, terminal record, cloud-init
// directory or slot lease on the node, and no QEMU process.
func (n *sliceNode) noSliceLeftovers(e *env) {
	n.t.Helper()
	ls, err := e.st.ListSlotLeases(context.Background(), "")
	if err != nil {
		n.t.Fatal(err)
	}
	if len(ls) != 0 {
		n.t.Errorf("slot leases left in the store: %+v", ls)
	}
	for _, dir := range []string{"slices/dhcp-hosts.d", "slices/terminal", "slices/leases", "cloud-init"} {
		if f := n.files(dir); len(f) != 0 {
			n.t.Errorf("%s left on the node: %v", dir, f)
		}
	}
	if procs := qemuProcesses(n.t, n.rtDir); len(procs) != 0 {
		n.t.Errorf("qemu processes left: %v", procs)
	}
}

// startProc runs n.o.agentBin against e's control plane. Its log is
// printed when the test fails.
func (n *sliceNode) startProc(e *env) {
	n.t.Helper()
	if n.logPath == "" {
		n.logPath = filepath.Join(n.t.TempDir(), "agent.log")
		n.t.Cleanup(func() {
			if n.t.Failed() {
				b, _ := os.ReadFile(n.logPath)
				n.t.Logf("agent log:\n%s", b)
			}
		})
	}
	env := append([]string{"NODE_AGENT_CONTROL_PLANE_URL=" + e.nodeURL, "NODE_AGENT_HOST_ID=" + n.id,
		"NODE_AGENT_BOOTSTRAP_TOKEN=" + n.token, "NODE_AGENT_CA_HASH=" + e.srv.CAHash(),
		"NODE_AGENT_STATE_DIR=" + n.stateDir, "NODE_AGENT_LISTEN=127.0.0.1:0", "NODE_AGENT_QEMU_ACCEL=tcg",
		"NODE_AGENT_RUNTIME=qemu", "NODE_AGENT_RUNTIME_DIR=" + n.rtDir, "NODE_AGENT_IMAGE_DIRS=" + n.imgDirs,
		"NODE_AGENT_QEMU_CGROUP_PARENT=none", "NODE_AGENT_HOST_ROOT=" + n.roots.Base,
		"NODE_AGENT_RECONCILE_INTERVAL=200ms", "NODE_AGENT_HEARTBEAT_INTERVAL=200ms"}, n.o.env...)
	n.stop = startAgentProc(n.t, n.o.agentBin, env, n.logPath).kill9
}
