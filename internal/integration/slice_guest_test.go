package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/node/guestssh"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestSliceVMGuestTCG does the node's work inside a slice VM on real QEMU
// (TCG) over the brokered SSH channel (the guest runs OpenSSH's sshd,
// pins its host key through the serial console): slice.vm_provision
// reports the guest's first telemetry (telemetry_ready) and the
// performance probe's figures; allocation.provision_user with vm_name
// creates the allocation's user inside the guest (the test then logs in
// as that user with its own key, host key pinned), is idempotent, rolls
// back a failing change (a shell the guest lacks leaves no account), and
// refuses an allocation that does not own the VM; the agent's /metrics
// carries the guest's gauges; deprovision_user removes the user.
func TestSliceVMGuestTCG(t *testing.T) {
	imgDir := t.TempDir()
	g := qemutest.BuildWith(t, imgDir, qemutest.Options{SSHD: true})
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("slice-guest")
	rtDir := t.TempDir()
	ag, _ := e.startAgent("slice-guest", bt.Token, agentOpts{runtime: "qemu", imageDirs: imgDir + "," + filepath.Dir(g.Kernel), runtimeDir: rtDir})
	t.Cleanup(func() {
		for _, pid := range qemuProcesses(t, rtDir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	e.waitHostStatus("slice-guest", api.HostHealthy, 30*time.Second)

	const vm, alloc, defUser, user = "slice-guest-vm", "alc_guest", "drover", "carol"
	prov := e.enqueue("slice-guest", task.TypeVMProvision, map[string]any{
		"allocation_id": alloc, "vm_name": vm, "default_username": defUser,
		"image_url": "file://" + g.Disk, "image_sha256": g.DiskSHA256, "driver_strategy": "none",
		"boot": api.DirectBoot{Kernel: api.Artifact{URL: "file://" + g.Kernel, SHA256: g.KernelSHA256},
			Initrd: &api.Artifact{URL: "file://" + g.Initrd, SHA256: g.InitrdSHA256}, Cmdline: g.Cmdline},
		"vcpus": 1, "memory_mib": 256,
		"network":          api.NetworkSpec{Mode: api.NetworkUser, Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22}}},
		"readiness_marker": g.Marker, "readiness_timeout_seconds": 180, "graceful_timeout_seconds": 30,
	})
	done := e.waitTask(prov.ID, 6*time.Minute)
	if done.State != api.TaskSucceeded {
		t.Fatalf("vm_provision %s: %+v\noutput: %s", done.State, done.Result.Error, done.Result.Output)
	}
	var out struct {
		SSHPort   int `json:"ssh_port"`
		Readiness struct {
			TelemetryReady bool `json:"telemetry_ready"`
		} `json:"readiness"`
		Telemetry   *guestssh.Telemetry `json:"telemetry"`
		Performance struct {
			Guest           *guestssh.Probe `json:"guest"`
			GuestProbeError string          `json:"guest_probe_error"`
		} `json:"performance"`
	}
	if err := json.Unmarshal(done.Result.Output, &out); err != nil {
		t.Fatal(err)
	}
	tel := out.Telemetry
	if !out.Readiness.TelemetryReady || tel == nil || !tel.Ready || tel.CPUs != 1 || tel.UptimeSeconds <= 0 ||
		tel.MemoryTotalBytes < 100<<20 || tel.MemoryTotalBytes > 256<<20 || tel.MemoryAvailableBytes <= 0 ||
		tel.GPUs != 0 || tel.GPUSource != "dev" {
		t.Errorf("telemetry_ready %v, telemetry %+v", out.Readiness.TelemetryReady, tel)
	}
	pg := out.Performance.Guest
	if pg == nil {
		t.Fatalf("no guest probe: %s", out.Performance.GuestProbeError)
	}
	if pg.CPULoopIterations != guestssh.DefaultProbeLimits.CPULoopIterations || pg.CPULoopMS <= 0 || pg.CPUIterationsPerS <= 0 ||
		pg.MemoryCopiedMiB != guestssh.DefaultProbeLimits.MemoryMiB || pg.MemoryMiBPerS <= 0 ||
		pg.DiskWrittenMiB != guestssh.DefaultProbeLimits.DiskMiB || pg.DiskWriteMiBPerS <= 0 ||
		pg.GPUsVisible != 0 || len(pg.Skipped) != 0 {
		t.Errorf("guest probe %+v", pg)
	}

	// The allocation's user inside the guest, with its own key.
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, _ := ssh.NewPublicKey(pub)
	userKey := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))) + " carol@laptop"
	provUser := func(params map[string]any) api.Task {
		t.Helper()
		tk := e.enqueue("slice-guest", task.TypeAllocProvisionUser, params)
		return e.waitTask(tk.ID, 2*time.Minute)
	}
	params := map[string]any{"allocation_id": alloc, "username": user, "vm_name": vm, "ssh_authorized_keys": []string{userKey}}
	var uout struct {
		Target string               `json:"target"`
		Via    string               `json:"via"`
		User   *guestssh.UserResult `json:"user"`
	}
	for i, wantCreated := range []bool{true, false} { // the second run is idempotent
		res := provUser(params)
		if res.State != api.TaskSucceeded {
			t.Fatalf("provision_user #%d %s: %+v", i+1, res.State, res.Result.Error)
		}
		_ = json.Unmarshal(res.Result.Output, &uout)
		if uout.Target != "guest" || uout.Via != "root" || uout.User == nil || uout.User.Created != wantCreated ||
			uout.User.UID != 1001 || uout.User.Home != "/home/"+user || uout.User.Keys != 1 {
			t.Fatalf("provision_user #%d output %s", i+1, res.Result.Output)
		}
	}

	// The user logs in with its own key (host key pinned from the record).
	recRaw, err := os.ReadFile(filepath.Join(rtDir, "slices", "terminal", vm+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		HostKeys []string `json:"host_keys"`
	}
	_ = json.Unmarshal(recRaw, &rec)
	keyFile := filepath.Join(t.TempDir(), "carol")
	blk, _ := ssh.MarshalPrivateKey(priv, "carol")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	target := guestssh.Target{Addr: "127.0.0.1:" + strconv.Itoa(out.SSHPort), User: user, KeyPath: keyFile, HostKeys: rec.HostKeys}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := guestssh.Open(ctx, target)
	if err != nil {
		t.Fatalf("log in as %s: %v", user, err)
	}
	got, err := c.Run(ctx, "id -un; cat ~/.ssh/authorized_keys | grep -c drover\n")
	_ = c.Close()
	if err != nil || !strings.HasPrefix(string(got), user+"\n2\n") {
		t.Fatalf("as %s: %q, %v", user, got, err)
	}

	// A failing change is rolled back: no account is left behind.
	bad := provUser(map[string]any{"allocation_id": alloc, "username": "dave", "vm_name": vm, "shell": "/bin/zsh"})
	if bad.State != api.TaskFailed || bad.Result.Error == nil || bad.Result.Error.Code != "guest_user_failed" ||
		!strings.Contains(bad.Result.Error.Message, "/bin/zsh does not exist") {
		t.Fatalf("provision_user with a missing shell %s: %+v", bad.State, bad.Result.Error)
	}
	// The VM belongs to another allocation: refused before dialing.
	other := provUser(map[string]any{"allocation_id": "alc_other", "username": "erin", "vm_name": vm})
	if other.State != api.TaskFailed || other.Result.Error == nil || other.Result.Error.Code != "guest_not_owned" {
		t.Fatalf("provision_user for another allocation %s: %+v", other.State, other.Result.Error)
	}
	if c, err := guestssh.Open(ctx, guestssh.Target{Addr: target.Addr, User: defUser, KeyPath: filepath.Join(rtDir, "slices", "keys", vm),
		HostKeys: rec.HostKeys}); err != nil {
		t.Fatal(err)
	} else {
		got, err := c.Run(ctx, "grep -c '^dave:' /etc/passwd; grep -c '^erin:' /etc/passwd; ls /home\n")
		_ = c.Close()
		if string(got) != "0\n0\ncarol\ndrover\n" {
			t.Errorf("after the refused and failed provisions the guest has %q (%v)", got, err)
		}
	}

	// /metrics carries the guest's gauges once the telemetry loop ran.
	addr, err := ag.LocalAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := `drover_agent_slice_guest_telemetry_up{vm="` + vm + `"} 1`
	var body string
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(body, want); {
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %s:\n%s", want, grepLines(body, "slice_guest"))
		}
		time.Sleep(time.Second)
		resp, err := http.Get("http://" + addr.String() + "/metrics")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		body = string(b)
	}
	if !strings.Contains(body, `drover_agent_slice_guest_cpus{vm="`+vm+`"} 1`) ||
		!strings.Contains(body, `drover_agent_slice_guest_memory_total_bytes{vm="`+vm+`"}`) {
		t.Errorf("/metrics:\n%s", grepLines(body, "slice_guest"))
	}

	// Deprovision removes the account this allocation's provision made.
	dep := e.enqueue("slice-guest", task.TypeAllocDeprovisionUser, map[string]any{"allocation_id": alloc, "username": user, "vm_name": vm})
	if res := e.waitTask(dep.ID, 2*time.Minute); res.State != api.TaskSucceeded || !strings.Contains(string(res.Result.Output), `"removed":true`) {
		t.Fatalf("deprovision_user %s: %+v %s", res.State, res.Result.Error, res.Result.Output)
	}
	if c, err := guestssh.Open(ctx, target); err == nil {
		_ = c.Close()
		t.Fatalf("%s still logs in after deprovision_user", user)
	}

	rel := e.enqueue("slice-guest", task.TypeVMRelease, map[string]any{"vm_name": vm, "allocation_id": alloc, "graceful_timeout_seconds": 30})
	if done := e.waitTask(rel.ID, 2*time.Minute); done.State != api.TaskSucceeded {
		t.Fatalf("vm_release %s: %+v", done.State, done.Result.Error)
	}
}
