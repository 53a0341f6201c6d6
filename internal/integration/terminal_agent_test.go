package integration

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// requireRoot skips a test that creates OS users, except under CI.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test creates OS users and must run as root under CI")
		}
		t.Skip("needs root to create the allocation's OS user")
	}
}

// waitAllocState waits for an allocation to reach state.
func (e *env) waitAllocState(id string, want api.AllocationState, within time.Duration) api.Allocation {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var a api.Allocation
		e.op(http.MethodGet, "/api/v1/allocations/"+id, nil, &a)
		if a.State == want {
			return a
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("allocation %s is %s (%s), want %s", id, a.State, a.StateReason, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTerminalRealAgent runs the whole chain with a real agent: the
// allocation's user is provisioned by allocation.provision_user, the
// terminal is a real PTY running as that user, and releasing the
// allocation removes the user, after which a terminal fails with
// terminal_pty_failed.
func TestTerminalRealAgent(t *testing.T) {
	requireRoot(t)
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.Terminal.RecordingDir = t.TempDir() })
	bt := e.createHost("term-host")
	e.startAgent("term-host", bt.Token, agentOpts{})
	e.waitHostStatus("term-host", api.HostHealthy, 10*time.Second)

	user := fmt.Sprintf("drvt%d", rand.IntN(1_000_000))
	t.Cleanup(func() { exec.Command("userdel", "-r", user).Run() })
	var a api.Allocation
	if st := e.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: "term-host"}, &a); st != http.StatusCreated {
		t.Fatalf("create allocation: HTTP %d", st)
	}
	if a.State != api.AllocationProvisioning {
		t.Fatalf("new host allocation is %s, want provisioning", a.State)
	}
	e.waitAllocState(a.ID, api.AllocationActive, 60*time.Second)

	tok := e.mintToken(a.ID, api.TerminalTokenRequest{Cols: 90, Rows: 25})
	br := e.dialTerminal(tok, wsOpts{})
	br.waitReady(20 * time.Second)
	n := rand.IntN(90000) + 10000
	br.send(terminal.ChanStdin, []byte(fmt.Sprintf("echo hello-$((%d+1)); id -un; stty size\n", n)))
	br.readUntil(fmt.Sprintf("hello-%d\r\n%s\r\n25 90\r\n", n+1, user), 10*time.Second)
	br.send(terminal.ChanResize, terminal.EncodeResize(terminal.Size{Cols: 132, Rows: 43}))
	time.Sleep(300 * time.Millisecond) // the gateway debounces resizes (100 ms)
	br.send(terminal.ChanStdin, []byte("stty size; exit 3\n"))
	br.readUntil("43 132\r\n", 10*time.Second)
	if c := br.control(10 * time.Second); c.Type != terminal.TypeExit || c.ExitCode != 3 {
		t.Fatalf("got %+v, want exit 3", c)
	}
	br.expectClose(websocket.StatusNormalClosure, "exit", 5*time.Second)
	s := e.waitSessionClosed(tok.SessionID, 5*time.Second)
	if want := []string{"token_ready", "browser_ws_ready", "terminal_open_sent", "node_stream_connected", "pty_ready"}; !slices.Equal(stateNames(s), want) {
		t.Fatalf("states %v", stateNames(s))
	}
	if s.ExitCode == nil || *s.ExitCode != 3 {
		t.Fatalf("session %+v", s)
	}
	task := e.waitTask(s.TaskID, 10*time.Second)
	if task.State != api.TaskSucceeded {
		t.Fatalf("terminal.open %s: %+v", task.State, task.Result)
	}

	// Release removes the user; a terminal opened for that user then fails
	// on the node with terminal_pty_failed (the allocation is re-activated
	// in the store to get past the gateway's own check).
	if st := e.op(http.MethodDelete, "/api/v1/allocations/"+a.ID, nil, nil); st != http.StatusAccepted {
		t.Fatalf("release: HTTP %d", st)
	}
	e.waitAllocState(a.ID, api.AllocationReleased, 60*time.Second)
	if err := exec.Command("id", user).Run(); err == nil {
		t.Fatalf("user %s still exists after release", user)
	}
	e.activeAllocation("alc_stale", "term-host", user)
	tok = e.mintToken("alc_stale", api.TerminalTokenRequest{})
	msg := e.dialTerminal(tok, wsOpts{}).expectError(terminal.CodePTYFailed, 20*time.Second)
	if !contains(msg, user) {
		t.Errorf("pty failure %q does not name the user", msg)
	}
	if s := e.waitSessionClosed(tok.SessionID, 5*time.Second); s.State != "failed" || s.ErrorCode != "terminal_pty_failed" ||
		!slices.Contains(stateNames(s), "node_stream_connected") {
		t.Fatalf("session %+v", s)
	}
}
