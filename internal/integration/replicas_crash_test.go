package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// failoverProxy is a TCP load balancer on loopback in front of the
// replicas' node listeners: each connection goes to the first backend that
// accepts it, in order. TLS passes through (the agents' mTLS ends at the
// replica), as with a TCP load balancer in a deployment.
type failoverProxy struct {
	ln       net.Listener
	backends []string
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
}

func startFailoverProxy(t *testing.T, backends ...string) *failoverProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &failoverProxy{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *failoverProxy) url() string { return "https://" + p.ln.Addr().String() }

func (p *failoverProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *failoverProxy) forward(c net.Conn) {
	var up net.Conn
	for _, b := range p.backends {
		var err error
		if up, err = net.DialTimeout("tcp", b, 2*time.Second); err == nil {
			break
		}
	}
	if up == nil || !p.track(c, up) {
		c.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) { _, _ = io.Copy(dst, src); done <- struct{}{} }
	go pipe(up, c)
	go pipe(c, up)
	<-done // either side ended: end both
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *failoverProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *failoverProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// gatedProbes is a diag.health_probe handler that records each run and
// holds it until release is closed.
type gatedProbes struct {
	mu      sync.Mutex
	runs    map[string]int
	started chan string
	release chan struct{}
}

func (g *gatedProbes) handlers() agent.Handlers {
	return agent.Handlers{task.TypeHealthProbe: {Timeout: time.Minute, Run: func(ctx context.Context, t agent.Task) (agent.Outcome, error) {
		g.mu.Lock()
		g.runs[t.ID]++
		g.mu.Unlock()
		g.started <- t.ID
		select {
		case <-g.release:
		case <-ctx.Done():
			return agent.Outcome{}, ctx.Err()
		}
		return agent.Outcome{Output: map[string]string{"ran": t.ID}}, nil
	}}}
}

// TestReplicaCrashFailover: three replicas on one PostgreSQL; replica B
// is a real `drover server` process, A and C run in this test. Two real
// agents reach the replicas through a TCP load balancer that prefers B, so
// their long-polls, heartbeats and results go to B: one runs the built-in
// handlers (its terminal session's browser and node stream are on B), the
// other runs health probes that block. B is killed (SIGKILL) with probes
// in flight. The agents fail over to A through the balancer; every task
// reaches exactly one final state with the result its handler produced,
// and each handler ran once; B's terminal session is failed by the
// surviving replicas within the node-stream timeout; and a new session,
// browser on C, works.
func TestReplicaCrashFailover(t *testing.T) {
	requireRoot(t)
	if pg == nil {
		pgtest.Skip(t, pgErr)
	}
	// The lease is two thirds of it and is swept every quarter lease: a dead
	// replica's session fails within 5/6 of it, and the rest is slack for a
	// loaded machine.
	const streamTimeout = 12 * time.Second
	bin := buildDrover(t)
	dir := t.TempDir()
	dsn := pg.NewDatabase(t)
	kekFile := filepath.Join(dir, "kek")
	if err := kek.CreateFile(kekFile); err != nil {
		t.Fatal(err)
	}
	key, _, err := kek.LoadFile(kekFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := func(c *server.Config) {
		c.KEK = kek.NewRing(key)
		c.AdvertiseNodeURL = c.NodeURL
		c.Terminal.NodeStreamTimeout = streamTimeout
		c.LongPollFallback = time.Second
	}
	a := startEnv(t, openPostgresDSN(t, dsn), cfg) // creates the CA and keys B and C share
	// B's node port is picked before it starts: its --advertise-node-url
	// names it (the one port here probed and freed; its operator
	// listener binds port 0).
	bNode := freePort(t)
	bp := &serverProc{t: t, bin: bin, storeSpec: dsn, nodeAddr: bNode, kekFile: kekFile,
		logPath: filepath.Join(dir, "b.log"), extra: []string{"--heartbeat-interval", harnessHeartbeat.String(),
			"--advertise-node-url", "https://" + bNode, "--terminal-node-stream-timeout", streamTimeout.String(),
			"--long-poll-fallback-interval", "1s", "--recording-dir", filepath.Join(dir, "rec-b")}}
	bp.start()
	t.Cleanup(bp.kill9)
	c := startEnv(t, openPostgresDSN(t, dsn), cfg)
	// B is driven through the same helpers: the store, so the CA and the
	// operator tokens, are shared.
	b := &env{t: t, srv: a.srv, opURL: "http://" + bp.opAddr, nodeURL: "https://" + bNode, opToken: a.opToken,
		opHTTP: http.DefaultClient}
	lb := startFailoverProxy(t, bNode, hostPort(a.nodeURL), hostPort(c.nodeURL))

	// The terminal agent, and a probe agent whose handlers block.
	termBT, probeBT := a.createHost("crash-term"), a.createHost("crash-probe")
	a.startAgent("crash-term", termBT.Token, agentOpts{url: lb.url()})
	g := &gatedProbes{runs: map[string]int{}, started: make(chan string, 64), release: make(chan struct{})}
	a.startAgent("crash-probe", probeBT.Token, agentOpts{url: lb.url(), handlers: g.handlers()})
	for _, h := range []string{"crash-term", "crash-probe"} {
		a.waitHostStatus(h, api.HostHealthy, 30*time.Second)
	}
	waitMetricAtLeast(t, b, `drover_node_long_polls{route="tasks"}`, 2, 30*time.Second)

	user := fmt.Sprintf("drvc%d", rand.IntN(1_000_000))
	t.Cleanup(func() { exec.Command("userdel", "-r", user).Run() })
	var al api.Allocation
	if st := a.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: "crash-term"}, &al); st != http.StatusCreated {
		t.Fatalf("create allocation: HTTP %d", st)
	}
	a.waitAllocState(al.ID, api.AllocationActive, 60*time.Second)

	// A session held by B: browser on B, node stream to B's advertised URL.
	tok := b.mintToken(al.ID, api.TerminalTokenRequest{Cols: 80, Rows: 24})
	br := b.dialTerminal(tok, wsOpts{})
	br.waitReady(30 * time.Second)
	br.send(terminal.ChanStdin, []byte("echo on-b\n"))
	br.readUntil("on-b\r\n", 15*time.Second)

	// Probes through C; B delivers them, and the agent runs four at once.
	const probes = 12
	ids := make([]string, 0, probes)
	for range probes {
		ids = append(ids, c.enqueue("crash-probe", task.TypeHealthProbe, nil).ID)
	}
	for range 4 {
		select {
		case <-g.started:
		case <-time.After(60 * time.Second):
			t.Fatal("probes did not start on the agent")
		}
	}

	crashed := time.Now()
	bp.kill9()
	s := a.waitSessionClosed(tok.SessionID, 4*streamTimeout)
	took := time.Since(crashed)
	t.Logf("B's session failed %s after the crash", took.Round(time.Millisecond))
	if took > streamTimeout {
		t.Errorf("B's session failed %s after the crash, want within the node-stream timeout %s", took, streamTimeout)
	}
	if s.State != string(terminal.StateFailed) || s.ErrorCode != string(terminal.CodeGatewayError) {
		t.Fatalf("B's session after the crash: state %s code %s msg %q", s.State, s.ErrorCode, s.ErrorMessage)
	}
	if !a.auditHas("terminal.replica_lost", tok.SessionID, string(terminal.CodeGatewayError)) {
		t.Errorf("no terminal.replica_lost audit record")
	}

	close(g.release) // the in-flight probes finish with B dead
	deadline := time.Now().Add(3 * time.Minute)
	for _, id := range ids {
		got := c.waitTask(id, time.Until(deadline))
		var out map[string]string
		if got.Result != nil {
			_ = json.Unmarshal(got.Result.Output, &out)
		}
		if got.State != api.TaskSucceeded || out["ran"] != id {
			t.Errorf("probe %s: %s, result %+v", id, got.State, got.Result)
		}
	}
	t.Logf("all probes final %s after the crash", time.Since(crashed).Round(time.Millisecond))
	// Both agents now long-poll A, the balancer's next backend.
	waitMetricAtLeast(t, a, `drover_node_long_polls{route="tasks"}`, 2, 30*time.Second)
	g.mu.Lock()
	for _, id := range ids {
		if g.runs[id] != 1 {
			t.Errorf("probe %s ran %d times, want 1", id, g.runs[id])
		}
	}
	g.mu.Unlock()

	// A new session through the survivors: browser on C, the agent's
	// long-poll on A.
	tok2 := c.mintToken(al.ID, api.TerminalTokenRequest{Cols: 80, Rows: 24})
	br2 := c.dialTerminal(tok2, wsOpts{})
	br2.waitReady(30 * time.Second)
	n := rand.IntN(90000) + 10000
	br2.send(terminal.ChanStdin, []byte(fmt.Sprintf("echo after-$((%d+1))\n", n)))
	br2.readUntil(fmt.Sprintf("after-%d\r\n", n+1), 15*time.Second)
	br2.send(terminal.ChanStdin, []byte("exit 3\n"))
	s2 := a.waitSessionClosed(tok2.SessionID, 15*time.Second)
	if s2.CloseReason != "exit" || s2.ExitCode == nil || *s2.ExitCode != 3 {
		t.Fatalf("session after the crash: state %s reason %s exit %v", s2.State, s2.CloseReason, s2.ExitCode)
	}
}

// hostPort is an https URL's host:port.
func hostPort(u string) string { return strings.TrimPrefix(u, "https://") }
