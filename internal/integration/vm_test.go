package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// tcgGuest builds the tiny guest into an image directory and returns the
// instance spec that boots it, the guest, and the agent's
// NODE_AGENT_IMAGE_DIRS (that directory and the test kernel's).
func tcgGuest(t testing.TB) (api.InstanceSpec, qemutest.Guest, string) {
	t.Helper()
	imgDir := t.TempDir()
	g := qemutest.Build(t, imgDir)
	imgDirs := imgDir + "," + filepath.Dir(g.Kernel)
	spec := api.InstanceSpec{
		Image: api.Artifact{URL: "file://" + g.Disk, SHA256: g.DiskSHA256},
		Boot: &api.DirectBoot{Kernel: api.Artifact{URL: "file://" + g.Kernel, SHA256: g.KernelSHA256},
			Initrd: &api.Artifact{URL: "file://" + g.Initrd, SHA256: g.InitrdSHA256}, Cmdline: g.Cmdline},
		VCPUs: 1, MemoryMiB: 256,
		Readiness:       api.Readiness{SerialMarker: g.Marker, Timeout: api.Duration(2 * time.Minute)},
		GracefulTimeout: api.Duration(30 * time.Second),
	}
	return spec, g, imgDirs
}

// qemuProcesses lists the pids of QEMU processes whose command line
// mentions needle (an instance's state path).
func qemuProcesses(t testing.TB, needle string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil {
			continue
		}
		s := string(cmd)
		if strings.Contains(s, "qemu-system") && strings.Contains(s, needle) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// overlays lists the files left in a runtime's overlay directory.
func overlays(t testing.TB, runtimeDir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(runtimeDir, "overlays"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestVMInstanceTCG is the real end-to-end: the control plane places a
// declared instance on an agent running the QEMU runtime; the agent's own
// accelerator probe must pick TCG on this machine (KVM guests hang here);
// the tiny guest boots to Ready; deleting it stops it gracefully and leaves
// no overlay and no QEMU process.
func TestVMInstanceTCG(t *testing.T) {
	spec, _, imgDir := tcgGuest(t)
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("vm-1")
	rtDir := t.TempDir()
	e.startAgent("vm-1", bt.Token, agentOpts{runtime: "qemu", realProbe: true, imageDirs: imgDir, runtimeDir: rtDir})
	h := e.waitHostStatus("vm-1", api.HostHealthy, 60*time.Second)
	waitCapacity(t, e, "vm-1")
	e.op(http.MethodGet, "/api/v1/hosts/vm-1", nil, &h)
	if h.SelectedAccel != "tcg" {
		t.Logf("host accelerators: %+v", h.Capabilities)
		if h.SelectedAccel == "" {
			t.Fatal("agent selected no accelerator")
		}
	}

	in := e.createInstance(api.CreateInstanceRequest{Name: "tiny", HostID: "vm-1", Spec: spec})
	ready := e.waitPhase(in.ID, api.InstanceReady, "", 3*time.Minute)
	if ready.Runtime == nil || ready.Runtime.Runtime != "qemu" || ready.Runtime.PID == 0 {
		t.Fatalf("ready runtime = %+v, want qemu with a pid", ready.Runtime)
	}
	if ready.Runtime.Accel != h.SelectedAccel {
		t.Errorf("instance accel %q, host selected %q", ready.Runtime.Accel, h.SelectedAccel)
	}
	if procs := qemuProcesses(t, rtDir); len(procs) != 1 || procs[0] != ready.Runtime.PID {
		t.Errorf("qemu processes for the runtime dir = %v, want exactly [%d]", procs, ready.Runtime.PID)
	}
	if ov := overlays(t, rtDir); len(ov) != 1 {
		t.Errorf("overlays = %v, want one", ov)
	}

	// Stop: the guest powers off on the ACPI button (graceful), the
	// process goes, the disk stays.
	if st := e.op(http.MethodPost, "/api/v1/instances/"+in.ID+"/stop", nil, nil); st != http.StatusOK {
		t.Fatalf("stop: HTTP %d", st)
	}
	stopped := e.waitPhase(in.ID, api.InstanceStopped, api.ReasonTerminatedByOperator, 2*time.Minute)
	if !strings.HasPrefix(stopped.Message, "stopped gracefully") {
		t.Errorf("stop message %q, want a graceful stop", stopped.Message)
	}
	if procs := qemuProcesses(t, rtDir); len(procs) != 0 {
		t.Errorf("qemu processes left after stop: %v", procs)
	}
	if ov := overlays(t, rtDir); len(ov) != 1 {
		t.Errorf("overlays after stop = %v, want the instance's disk kept", ov)
	}

	if st := e.op(http.MethodDelete, "/api/v1/instances/"+in.ID, nil, nil); st != http.StatusAccepted {
		t.Fatalf("delete: HTTP %d", st)
	}
	e.waitGone(in.ID, 2*time.Minute)
	if procs := qemuProcesses(t, rtDir); len(procs) != 0 {
		t.Errorf("qemu processes left after delete: %v", procs)
	}
	if ov := overlays(t, rtDir); len(ov) != 0 {
		t.Errorf("overlays left after delete: %v", ov)
	}
	if !e.auditHas("instance.delete", in.ID, "") {
		t.Errorf("no instance.delete audit record for %s", in.ID)
	}
}

var (
	agentBuildOnce sync.Once
	agentBin       string
	agentBuildErr  error
)

// buildAgent compiles cmd/drover-agent once per test binary.
func buildAgent(t testing.TB) string {
	t.Helper()
	agentBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "drover-agent-bin-")
		if err != nil {
			agentBuildErr = err
			return
		}
		agentBin = filepath.Join(dir, "drover-agent")
		out, err := exec.Command("go", "build", "-o", agentBin, "../../cmd/drover-agent").CombinedOutput()
		if err != nil {
			agentBuildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if agentBuildErr != nil {
		t.Fatal(agentBuildErr)
	}
	return agentBin
}

// agentProc is a drover-agent child process.
type agentProc struct {
	t   *testing.T
	cmd *exec.Cmd
}

func startAgentProc(t *testing.T, bin string, env []string, logPath string) *agentProc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	// The agent reads /etc/drover-agent/env by default: a machine's own
	// (or one a package test installed) must not change the test's agent.
	cmd.Env = append(append(os.Environ(), "NODE_AGENT_ENV_FILE=/dev/null"), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	p := &agentProc{t: t, cmd: cmd}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return p
}

func (p *agentProc) kill9() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// TestAgentKill9ReadoptsVM kills the agent process with SIGKILL while its
// VM runs. The VM keeps running; the restarted agent re-adopts it (same
// pid, no second QEMU) and the instance is still Ready; then a delete
// cleans everything up.
func TestAgentKill9ReadoptsVM(t *testing.T) {
	spec, _, imgDir := tcgGuest(t)
	bin := buildAgent(t)
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("vm-k9")
	stateDir, rtDir := t.TempDir(), t.TempDir()
	logPath := filepath.Join(t.TempDir(), "agent.log")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("agent log:\n%s", b)
		}
	})
	env := []string{"NODE_AGENT_CONTROL_PLANE_URL=" + e.nodeURL, "NODE_AGENT_HOST_ID=vm-k9",
		"NODE_AGENT_BOOTSTRAP_TOKEN=" + bt.Token, "NODE_AGENT_CA_HASH=" + e.srv.CAHash(),
		"NODE_AGENT_STATE_DIR=" + stateDir, "NODE_AGENT_LISTEN=127.0.0.1:0", "NODE_AGENT_QEMU_ACCEL=tcg",
		"NODE_AGENT_RUNTIME=qemu", "NODE_AGENT_RUNTIME_DIR=" + rtDir, "NODE_AGENT_IMAGE_DIRS=" + imgDir,
		"NODE_AGENT_RECONCILE_INTERVAL=200ms", "NODE_AGENT_HEARTBEAT_INTERVAL=200ms"}
	p := startAgentProc(t, bin, env, logPath)
	e.waitHostStatus("vm-k9", api.HostHealthy, 60*time.Second)
	waitCapacity(t, e, "vm-k9")

	in := e.createInstance(api.CreateInstanceRequest{Name: "survivor", HostID: "vm-k9", Spec: spec})
	ready := e.waitPhase(in.ID, api.InstanceReady, "", 3*time.Minute)
	pid := ready.Runtime.PID

	p.kill9()
	if procs := qemuProcesses(t, rtDir); len(procs) != 1 || procs[0] != pid {
		t.Fatalf("after kill -9 of the agent, qemu processes = %v, want [%d] still running", procs, pid)
	}
	startAgentProc(t, bin, env, logPath)
	// Give the restarted agent a few reconcile passes, then check nothing
	// was duplicated or restarted.
	e.waitHostStatus("vm-k9", api.HostHealthy, 60*time.Second)
	time.Sleep(2 * time.Second)
	after := e.waitPhase(in.ID, api.InstanceReady, "", 30*time.Second)
	if after.Runtime == nil || after.Runtime.PID != pid {
		t.Errorf("after restart the instance runs as %+v, want the adopted pid %d", after.Runtime, pid)
	}
	if procs := qemuProcesses(t, rtDir); len(procs) != 1 || procs[0] != pid {
		t.Errorf("after restart qemu processes = %v, want only [%d]", procs, pid)
	}
	if after.Generation != ready.Generation {
		t.Errorf("generation changed across the restart: %d → %d", ready.Generation, after.Generation)
	}

	if st := e.op(http.MethodDelete, "/api/v1/instances/"+in.ID, nil, nil); st != http.StatusAccepted {
		t.Fatalf("delete: HTTP %d", st)
	}
	e.waitGone(in.ID, 2*time.Minute)
	if procs := qemuProcesses(t, rtDir); len(procs) != 0 {
		t.Errorf("qemu processes left after delete: %v", procs)
	}
	if ov := overlays(t, rtDir); len(ov) != 0 {
		t.Errorf("overlays left after delete: %v", ov)
	}
}

// TestSliceVMProvisionTCG runs slice.vm_provision and slice.vm_release
// through the control plane on a real QEMU (TCG) host without GPUs: all 17
// phases run in the seed's order and are timed, the VM becomes ready, and
// the release stops it gracefully and leaves nothing behind.
func TestSliceVMProvisionTCG(t *testing.T) {
	_, g, imgDir := tcgGuest(t)
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("slice-1")
	rtDir := t.TempDir()
	e.startAgent("slice-1", bt.Token, agentOpts{runtime: "qemu", imageDirs: imgDir, runtimeDir: rtDir})
	e.waitHostStatus("slice-1", api.HostHealthy, 30*time.Second)

	prov := e.enqueue("slice-1", task.TypeVMProvision, map[string]any{
		"allocation_id": "alloc-1", "vm_name": "slice-tcg",
		"image_url": "file://" + g.Disk, "image_sha256": g.DiskSHA256, "driver_strategy": "none",
		"boot": api.DirectBoot{Kernel: api.Artifact{URL: "file://" + g.Kernel, SHA256: g.KernelSHA256},
			Initrd: &api.Artifact{URL: "file://" + g.Initrd, SHA256: g.InitrdSHA256}, Cmdline: g.Cmdline},
		"vcpus": 1, "memory_mib": 256, "network": api.NetworkSpec{Mode: api.NetworkUser},
		"readiness_marker": g.Marker, "readiness_timeout_seconds": 120, "graceful_timeout_seconds": 30,
	})
	done := e.waitTask(prov.ID, 4*time.Minute)
	if done.State != api.TaskSucceeded {
		t.Fatalf("vm_provision %s: %+v\noutput: %s", done.State, done.Result.Error, done.Result.Output)
	}
	var out struct {
		VMName       string `json:"vm_name"`
		DefaultUser  string `json:"default_user"`
		PrivateIP    string `json:"private_ip"`
		SlotCount    *int   `json:"slot_count"`
		ConsoleModel string `json:"console_model"`
		RawVNC       *bool  `json:"raw_vnc"`
		SerialSocket string `json:"serial_socket"`
		Readiness    struct {
			Ready bool `json:"ready"`
		} `json:"readiness"`
		Timings map[string]int64 `json:"timings"`
	}
	if err := json.Unmarshal(done.Result.Output, &out); err != nil {
		t.Fatalf("decode output %s: %v", done.Result.Output, err)
	}
	if out.VMName != "slice-tcg" || out.DefaultUser == "" || out.PrivateIP == "" || out.SlotCount == nil ||
		*out.SlotCount != 0 || out.ConsoleModel != "gateway_required" || out.RawVNC == nil || *out.RawVNC ||
		!out.Readiness.Ready || out.SerialSocket == "" {
		t.Errorf("vm_provision output = %s", done.Result.Output)
	}
	for _, ph := range slicevm.ProvisionPhases() {
		if _, ok := done.Result.Timings[ph+"_ms"]; !ok {
			t.Errorf("timings lack %s_ms: %v", ph, done.Result.Timings)
		}
	}
	var order []string
	for _, ev := range done.Events {
		if slices.Contains(slicevm.ProvisionPhases(), ev.Phase) {
			order = append(order, ev.Phase)
		}
	}
	if !slices.Equal(order, slicevm.ProvisionPhases()) {
		t.Errorf("progress phases = %v, want %v", order, slicevm.ProvisionPhases())
	}
	if procs := qemuProcesses(t, rtDir); len(procs) != 1 {
		t.Errorf("qemu processes = %v, want one", procs)
	}

	rel := e.enqueue("slice-1", task.TypeVMRelease, map[string]any{"vm_name": "slice-tcg", "allocation_id": "alloc-1",
		"graceful_timeout_seconds": 30})
	done = e.waitTask(rel.ID, 2*time.Minute)
	if done.State != api.TaskSucceeded {
		t.Fatalf("vm_release %s: %+v\noutput: %s", done.State, done.Result.Error, done.Result.Output)
	}
	var relOut struct {
		HardStopped *bool `json:"hard_stopped"`
	}
	_ = json.Unmarshal(done.Result.Output, &relOut)
	if relOut.HardStopped == nil || *relOut.HardStopped {
		t.Errorf("vm_release output = %s, want hard_stopped=false (the guest powers off on ACPI)", done.Result.Output)
	}
	if procs := qemuProcesses(t, rtDir); len(procs) != 0 {
		t.Errorf("qemu processes left after release: %v", procs)
	}
	if ov := overlays(t, rtDir); len(ov) != 0 {
		t.Errorf("overlays left after release: %v", ov)
	}
	if ents, _ := os.ReadDir(filepath.Join(rtDir, "cloud-init")); len(ents) != 0 {
		t.Errorf("cloud-init dirs left after release: %v", ents)
	}
}
