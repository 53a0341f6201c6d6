package integration

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
)

var (
	buildOnce sync.Once
	droverBin string
	buildErr  error
)

// buildDrover compiles cmd/drover once per test binary.
func buildDrover(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "drover-bin-")
		if err != nil {
			buildErr = err
			return
		}
		droverBin = filepath.Join(dir, "drover")
		out, err := exec.Command("go", "build", "-o", droverBin, "../../cmd/drover").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return droverBin
}

// freePort is an address on 127.0.0.1 nothing listens on now, for a
// server started later: below the ephemeral range (testutil.FreePort),
// where the test's own outgoing connections cannot take it meanwhile.
func freePort(t *testing.T) string {
	return fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
}

// serverProc is a `drover server` child process.
type serverProc struct {
	t                *testing.T
	bin, storeSpec   string
	opAddr, nodeAddr string
	kekFile          string // the store's key-encryption key
	cmd              *exec.Cmd
	exited           chan struct{}
	logPath          string
	extra            []string // more flags
}

// newServerProc prepares a `drover server` child on storeSpec with its
// files in dir (a new KEK, server.log), plus extra flags, and creates an
// admin operator token for it through `drover token create`; start runs
// it. Its first start binds loopback port 0 for both listeners.
func newServerProc(t *testing.T, bin, storeSpec, dir string, extra ...string) (*serverProc, api.OperatorToken) {
	t.Helper()
	p := &serverProc{t: t, bin: bin, storeSpec: storeSpec, logPath: filepath.Join(dir, "server.log"), kekFile: filepath.Join(dir, "kek"), extra: extra}
	if err := kek.CreateFile(p.kekFile); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "token", "create", "test", "--store", storeSpec, "--kek-file", p.kekFile, "--json").Output()
	if err != nil {
		t.Fatalf("token create: %v", err)
	}
	var tok api.OperatorToken
	if err := json.Unmarshal(out, &tok); err != nil {
		t.Fatal(err)
	}
	return p, tok
}

// listeningRE is the line `drover server` logs once both listeners are
// bound, with the addresses they got.
var listeningRE = regexp.MustCompile(`msg="control plane listening" operator=(\S+) node=(\S+)`)

// start runs the child and waits until it is ready. An address left empty
// (the first start) is bound on port 0 and read back from its log, so no
// port is probed and freed before the child binds it; a restart reuses the
// ports the first start got, as an agent's configured URL must.
func (p *serverProc) start() {
	p.t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	logStart, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		p.t.Fatal(err)
	}
	opAddr, nodeAddr := cmp.Or(p.opAddr, "127.0.0.1:0"), cmp.Or(p.nodeAddr, "127.0.0.1:0")
	p.cmd = exec.Command(p.bin, "server", "--store", p.storeSpec, "--listen", opAddr,
		"--node-listen", nodeAddr, "--heartbeat-interval", "200ms", "--kek-file", p.kekFile)
	p.cmd.Args = append(p.cmd.Args, p.extra...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.exited = make(chan struct{})
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for p.opAddr == "" || p.nodeAddr == "" {
		log, _ := os.ReadFile(p.logPath)
		if m := listeningRE.FindSubmatch(log[min(int(logStart), len(log)):]); m != nil {
			p.opAddr, p.nodeAddr = string(m[1]), string(m[2])
			break
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("drover server did not log its listeners:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		resp, err := http.Get("http://" + p.opAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(p.logPath)
			p.t.Fatalf("drover server not ready: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill9 kills the process without letting it clean up.
func (p *serverProc) kill9() {
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.t.Errorf("drover server (pid %d) did not exit after SIGKILL", p.cmd.Process.Pid)
	}
}

// TestControlPlaneKill9BetweenClaimAndResult: the control plane dies
// (SIGKILL) after the agent claimed a task and before the result arrives;
// the agent is then restarted too with the result still unposted. After
// both come back the task completes with exactly the result the handler
// produced, and the handler ran exactly once.
func TestControlPlaneKill9BetweenClaimAndResult(t *testing.T) {
	bin := buildDrover(t)
	dir := t.TempDir()
	storeSpec := "sqlite:" + filepath.Join(dir, "drover.db")
	p, tok := newServerProc(t, bin, storeSpec, dir)
	p.start()
	t.Cleanup(p.kill9)

	// Drive the child through the same helpers as in-process replicas.
	e := &env{t: t, opURL: "http://" + p.opAddr, nodeURL: "https://" + p.nodeAddr, opToken: tok.Token, opHTTP: http.DefaultClient}
	var ca struct {
		CAHash string `json:"ca_hash"`
	}
	e.op(http.MethodGet, "/api/v1/ca", nil, &ca)
	bt := e.createHost("node-k")

	var runs atomic.Int32
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	handlers := agent.Handlers{"diag.health_probe": {Timeout: time.Minute, Run: func(ctx context.Context, _ agent.Task) (agent.Outcome, error) {
		runs.Add(1)
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return agent.Outcome{}, ctx.Err()
		}
		return agent.Outcome{Output: map[string]string{"answer": "42"}}, nil
	}}}
	stateDir := t.TempDir()
	newAgent := func() (stop func()) {
		cfg := agent.Config{ControlPlaneURL: e.nodeURL, HostID: "node-k", BootstrapToken: bt.Token, CAHash: ca.CAHash,
			OSFamily: "linux", StateDir: stateDir, ListenAddr: "127.0.0.1:0", HeartbeatInterval: 100 * time.Millisecond}
		a, err := agent.New(cfg, agent.WithHandlers(handlers), agent.WithLogger(testLogger(t)), agent.WithAccelProbe(fixedAccel(accel.TCG)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = a.Run(ctx); close(done) }()
		return func() { cancel(); <-done }
	}
	stopAgent := newAgent()

	task := e.enqueue("node-k", "diag.health_probe", nil)
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("handler never started")
	}
	p.kill9()
	close(release) // the handler finishes while the control plane is dead
	// Give the agent time to fail its first post and spool the result.
	spooled := regexp.MustCompile(`"task_id":"` + task.ID + `"`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(stateDir, "tasks", task.ID+".json"))
		if spooled.Match(b) && regexp.MustCompile(`"result":\{`).Match(b) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("result never spooled: %s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopAgent() // the agent restarts with an unposted result

	p.start()
	stopAgent = newAgent()
	defer stopAgent()
	got := e.waitTask(task.ID, 60*time.Second)
	if got.State != api.TaskSucceeded || string(got.Result.Output) != `{"answer":"42"}` {
		t.Fatalf("task %s %+v", got.State, got.Result)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	var evs []api.AuditEvent
	e.op(http.MethodGet, "/api/v1/audit?target="+task.ID, nil, &evs)
	results := 0
	for _, ev := range evs {
		if ev.Action == "task.result" && ev.Result == "succeeded" {
			results++
		}
	}
	if results < 1 {
		t.Fatalf("no result audited: %+v", evs)
	}
}
