package integration

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// advertiseSelf makes a replica advertise its own node listener, as
// --advertise-node-url does in a multi-replica deployment.
func advertiseSelf(c *server.Config) { c.AdvertiseNodeURL = c.NodeURL }

// replicaPair starts two replicas on one PostgreSQL database, both
// advertising their own node-facing URL, and a real agent whose control
// plane (and so terminal) URL is replica b's. It returns the replicas and
// an active allocation on the agent's host with a real OS user.
func replicaPair(t *testing.T, mutate ...func(*server.Config)) (a, b *env, allocID, user string) {
	t.Helper()
	requireRoot(t)
	if pg == nil {
		pgtest.Skip(t, pgErr)
	}
	dsn := pg.NewDatabase(t)
	opts := append([]func(*server.Config){advertiseSelf}, mutate...)
	a = startEnv(t, openPostgresDSN(t, dsn), opts...)
	b = startEnv(t, openPostgresDSN(t, dsn), opts...)
	bt := a.createHost("rep-host")
	b.startAgent("rep-host", bt.Token, agentOpts{url: b.nodeURL})
	a.waitHostStatus("rep-host", api.HostHealthy, 20*time.Second)

	user = fmt.Sprintf("drvr%d", rand.IntN(1_000_000))
	t.Cleanup(func() { exec.Command("userdel", "-r", user).Run() })
	var al api.Allocation
	if st := a.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: "rep-host"}, &al); st != http.StatusCreated {
		t.Fatalf("create allocation: HTTP %d", st)
	}
	a.waitAllocState(al.ID, api.AllocationActive, 60*time.Second)
	return a, b, al.ID, user
}

// TestReplicaTerminalCrossReplica: the browser is on replica A, the agent
// long-polls replica B and is configured with B's URL as its terminal URL
// (what a load balancer in front of the replicas could hand it). A puts
// its own node-facing URL in the signed terminal.open, the agent dials A,
// and the session works end to end.
func TestReplicaTerminalCrossReplica(t *testing.T) {
	a, b, allocID, user := replicaPair(t, func(c *server.Config) { c.Terminal.RecordingDir = t.TempDir() })

	tok := b.mintToken(allocID, api.TerminalTokenRequest{Cols: 80, Rows: 24})
	br := a.dialTerminal(tok, wsOpts{})
	br.waitReady(20 * time.Second)
	n := rand.IntN(90000) + 10000
	br.send(terminal.ChanStdin, []byte(fmt.Sprintf("echo cross-$((%d+1)); id -un\n", n)))
	br.readUntil(fmt.Sprintf("cross-%d\r\n%s\r\n", n+1, user), 10*time.Second)
	br.send(terminal.ChanStdin, []byte("exit 4\n"))
	s := b.waitSessionClosed(tok.SessionID, 10*time.Second)
	if s.State != string(terminal.StatePTYReady) || s.CloseReason != "exit" || s.ExitCode == nil || *s.ExitCode != 4 {
		t.Fatalf("session read on B: state %s exit %v reason %s (states %v)", s.State, s.ExitCode, s.CloseReason, stateNames(s))
	}
}

// TestReplicaTerminalCrashFailsSession: replica A holds a live session and
// dies (its database connections go first, so nothing it does on the way
// down reaches the store, as with kill -9); replica B fails the session
// within the node-stream timeout instead of leaving it open.
func TestReplicaTerminalCrashFailsSession(t *testing.T) {
	const streamTimeout = 3 * time.Second
	a, b, allocID, _ := replicaPair(t, func(c *server.Config) { c.Terminal.NodeStreamTimeout = streamTimeout })
	tok := a.mintToken(allocID, api.TerminalTokenRequest{Cols: 80, Rows: 24})
	br := a.dialTerminal(tok, wsOpts{})
	br.waitReady(20 * time.Second)
	br.send(terminal.ChanStdin, []byte("echo alive\n"))
	br.readUntil("alive\r\n", 10*time.Second)

	crashed := time.Now()
	if err := a.st.Close(); err != nil {
		t.Fatalf("close replica A's store: %v", err)
	}
	a.stop()
	a.stop = nil
	s := b.waitSessionClosed(tok.SessionID, 2*streamTimeout)
	if took := time.Since(crashed); took > streamTimeout {
		t.Errorf("session failed %s after the crash, want within the node-stream timeout %s", took, streamTimeout)
	}
	if s.State != string(terminal.StateFailed) || s.ErrorCode != string(terminal.CodeGatewayError) ||
		!contains(s.ErrorMessage, a.nodeURL) {
		t.Fatalf("session after A's crash: state %s code %s msg %q", s.State, s.ErrorCode, s.ErrorMessage)
	}
	if !b.auditHas("terminal.replica_lost", tok.SessionID, string(terminal.CodeGatewayError)) {
		t.Errorf("no terminal.replica_lost audit record")
	}
}
