package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// TestSliceVMTerminalTCG brokers a browser terminal through the control
// plane into a slice VM on real QEMU (TCG): the guest (qemutest with
// OpenSSH's sshd) gets the terminal key through the cloud-init seed and
// reports its host key on the serial console; the gateway queues
// terminal.open in mode vm_ssh for the allocation's own VM, the node SSHes
// into the guest over its loopback forward, and the session goes through
// the whole readiness chain to the guest user's shell, recorded, over the
// gateway's WebSocket and in headless Chromium. Then the
// refusals, each a structured error naming its hop: an allocation that
// does not own the VM (guest_not_owned), a guest whose host key is not the
// pinned one (guest_host_key_mismatch, never reaching pty_ready), and a
// released VM (guest_terminal_unavailable).
func TestSliceVMTerminalTCG(t *testing.T) {
	imgDir := t.TempDir()
	g := qemutest.BuildWith(t, imgDir, qemutest.Options{SSHD: true})
	p := startBrowser(t)
	e := browserEnv(t)
	bt := e.createHost("slice-term")
	rtDir := t.TempDir()
	e.startAgent("slice-term", bt.Token, agentOpts{runtime: "qemu", imageDirs: imgDir + "," + filepath.Dir(g.Kernel), runtimeDir: rtDir})
	killGuests(t, rtDir)
	e.waitHostStatus("slice-term", api.HostHealthy, 30*time.Second)

	const vm, alloc, user = "slice-alc-vm", "alc_vm", "alice"
	prov := e.enqueue("slice-term", task.TypeVMProvision, map[string]any{
		"allocation_id": alloc, "vm_name": vm, "default_username": user,
		"image_url": "file://" + g.Disk, "image_sha256": g.DiskSHA256, "driver_strategy": "none",
		"boot": api.DirectBoot{Kernel: api.Artifact{URL: "file://" + g.Kernel, SHA256: g.KernelSHA256},
			Initrd: &api.Artifact{URL: "file://" + g.Initrd, SHA256: g.InitrdSHA256}, Cmdline: g.Cmdline},
		"vcpus": 1, "memory_mib": 256,
		"network":          api.NetworkSpec{Mode: api.NetworkUser, Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22}}},
		"readiness_marker": g.Marker, "readiness_timeout_seconds": 180, "graceful_timeout_seconds": 30,
	})
	done := e.waitTask(prov.ID, 5*time.Minute)
	if done.State != api.TaskSucceeded {
		t.Fatalf("vm_provision %s: %+v\noutput: %s", done.State, done.Result.Error, done.Result.Output)
	}
	var out struct {
		SSHHost      string `json:"ssh_host"`
		SSHPort      int    `json:"ssh_port"`
		RawVNC       *bool  `json:"raw_vnc"`
		ConsoleModel string `json:"console_model"`
	}
	_ = json.Unmarshal(done.Result.Output, &out)
	if out.SSHHost != "127.0.0.1" || out.SSHPort == 0 || out.RawVNC == nil || *out.RawVNC || out.ConsoleModel != "gateway_required" {
		t.Fatalf("vm_provision output %s", done.Result.Output)
	}
	recPath := filepath.Join(rtDir, "slices", "terminal", vm+".json")
	var rec struct {
		HostKeys      []string `json:"host_keys"`
		HostKeySource string   `json:"host_key_source"`
	}
	recRaw, err := os.ReadFile(recPath)
	if err != nil || json.Unmarshal(recRaw, &rec) != nil || len(rec.HostKeys) != 1 || rec.HostKeySource != "serial_console" {
		t.Fatalf("terminal record %s: %s (%v)", recPath, recRaw, err)
	}

	// The allocation and its workflow as sliceflow leaves them once the VM
	// is active (the workflow itself is tested in internal/cp/sliceflow).
	activeSlice := func(id, vmName string) {
		t.Helper()
		ctx := context.Background()
		now := time.Now().UTC()
		spec, _ := json.Marshal(api.SliceRequest{Slots: 1})
		plan, _ := json.Marshal(map[string]any{"vm_name": vmName})
		if err := e.st.CreateAllocation(ctx, store.Allocation{ID: id, Username: user, HostID: "slice-term",
			State: api.AllocationActive, Spec: spec, CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := e.st.CreateSliceWorkflow(ctx, store.SliceWorkflow{AllocationID: id, HostID: "slice-term",
			Status: store.SliceFlowActive, Spec: spec, Plan: plan, CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	activeSlice(alloc, vm)

	tok := e.mintToken(alloc, api.TerminalTokenRequest{Cols: 90, Rows: 25})
	br := e.dialTerminal(tok, wsOpts{})
	br.waitReady(60 * time.Second)
	br.send(terminal.ChanStdin, []byte("echo vm-$((40+2)); id -un; stty size\n"))
	br.readUntil(fmt.Sprintf("vm-42\r\n%s\r\n25 90\r\n", user), 30*time.Second)
	br.send(terminal.ChanStdin, []byte("exit 3\n"))
	if c := br.control(30 * time.Second); c.Type != terminal.TypeExit || c.ExitCode != 3 {
		t.Fatalf("got %+v, want exit 3", c)
	}
	br.expectClose(websocket.StatusNormalClosure, "exit", 10*time.Second)
	s := e.waitSessionClosed(tok.SessionID, 10*time.Second)
	if want := []string{"token_ready", "browser_ws_ready", "terminal_open_sent", "node_stream_connected", "pty_ready"}; !slices.Equal(stateNames(s), want) {
		t.Fatalf("states %v", stateNames(s))
	}
	if s.Mode != task.TerminalModeVMSSH || s.ExitCode == nil || *s.ExitCode != 3 {
		t.Fatalf("session %+v", s)
	}
	if rec := e.recordedOutput(s); !strings.Contains(rec, "vm-42") {
		t.Errorf("the recording lacks the command's output: %q", rec)
	}

	// The same in headless Chromium: typed input, output, resizes (the
	// guest PTY follows the window), exit code, recording and replay.
	browserShellSession(t, p, e, alloc, user, task.TerminalModeVMSSH)

	refused := func(allocID, code string) api.TerminalSession {
		t.Helper()
		tok := e.mintToken(allocID, api.TerminalTokenRequest{})
		msg := e.dialTerminal(tok, wsOpts{}).expectError(terminal.CodePTYFailed, 60*time.Second)
		if !strings.HasPrefix(msg, code+": ") {
			t.Errorf("error message %q does not start with %s", msg, code)
		}
		s := e.waitSessionClosed(tok.SessionID, 10*time.Second)
		if s.State != "failed" || slices.Contains(stateNames(s), "pty_ready") {
			t.Errorf("session %+v", s)
		}
		tk := e.waitTask(s.TaskID, 30*time.Second)
		if tk.State != api.TaskFailed || tk.Result.Error == nil || tk.Result.Error.Code != code {
			t.Errorf("terminal.open %s: %+v", tk.State, tk.Result.Error)
		}
		return s
	}

	// Another allocation whose (forged) workflow names this VM: the node
	// checks the signed request's allocation against the VM's own record.
	activeSlice("alc_other", vm)
	refused("alc_other", termnode.CodeGuestNotOwned)

	// A pinned key the guest does not have: refused before authenticating.
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := ssh.NewPublicKey(pub)
	var recMap map[string]any
	_ = json.Unmarshal(recRaw, &recMap)
	recMap["host_keys"] = []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))}
	forged, _ := json.Marshal(recMap)
	if err := os.WriteFile(recPath, forged, 0o600); err != nil {
		t.Fatal(err)
	}
	refused(alloc, termnode.CodeGuestHostKeyMismatch)
	if err := os.WriteFile(recPath, recRaw, 0o600); err != nil {
		t.Fatal(err)
	}

	rel := e.enqueue("slice-term", task.TypeVMRelease, map[string]any{"vm_name": vm, "allocation_id": alloc,
		"graceful_timeout_seconds": 30})
	if done := e.waitTask(rel.ID, 2*time.Minute); done.State != api.TaskSucceeded {
		t.Fatalf("vm_release %s: %+v", done.State, done.Result.Error)
	}
	if _, err := os.Stat(recPath); !os.IsNotExist(err) {
		t.Errorf("terminal record left after release: %v", err)
	}
	refused(alloc, termnode.CodeGuestTerminalUnavailable)
}
