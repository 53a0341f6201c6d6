package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Durability under faults (issue 19): durabilityTasks diag.echo tasks run
// through a real `drover server` and a real `drover-agent` while both are
// killed with SIGKILL at random times, durabilityKills of each. Seeded:
// DROVER_DURABILITY_SEED replays a run (the seed is logged).
const (
	durabilityTasks = 1000
	durabilityKills = 5
	// durabilityWindow is the span the kills and the enqueues are spread
	// over.
	durabilityWindow = 15 * time.Second
	durabilityNode   = "node-dur"
)

// TestDurabilityKill9 proves, on SQLite and on PostgreSQL, that every task
// reaches exactly one final state with its result and that no result is
// applied twice:
//   - each enqueued correlation id names exactly one task (enqueues are
//     retried after a kill only when a lookup finds nothing);
//   - each task is succeeded with the echo of its own message, or failed
//     with agent_restarted_during_task (the agent was killed while the
//     handler ran: the replay cache refuses to run it again); nothing is
//     expired or canceled (deadlines are 30 minutes);
//   - the agent's log shows the handler ran once for each succeeded task
//     and at most once for any task, across all agent restarts;
//   - the final states and results do not change afterwards (the agent's
//     spool re-posts are idempotent) and the audit log holds no refused
//     second result.
func TestDurabilityKill9(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("DROVER_DURABILITY_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("DROVER_DURABILITY_SEED: %v", err)
		}
	}
	t.Logf("seed %d (DROVER_DURABILITY_SEED=%d replays it)", seed, seed)
	for i, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) { runDurability(t, name, seed+uint64(i)) })
	}
}

func runDurability(t *testing.T, backend string, seed uint64) {
	start := time.Now()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	bin, agentBin := buildDrover(t), buildAgent(t)
	dir := t.TempDir()
	storeSpec := "sqlite:" + filepath.Join(dir, "drover.db")
	if backend == "postgres" {
		if pg == nil {
			pgtest.Skip(t, pgErr)
		}
		storeSpec = pg.NewDatabase(t)
	}
	// No periodic health probe: one whose slot fell inside the run would be
	// a task the test did not enqueue.
	p, tok := newServerProc(t, bin, storeSpec, dir, "--health-probe-interval", "0")
	p.start()
	t.Cleanup(p.kill9) // registered before the database drop runs
	agentLog := filepath.Join(dir, "agent.log")
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{p.logPath, agentLog} {
				b, _ := os.ReadFile(f)
				if len(b) > 20000 {
					b = b[len(b)-20000:]
				}
				t.Logf("%s (tail):\n%s", f, b)
			}
		}
	})
	e := &env{t: t, opURL: "http://" + p.opAddr, nodeURL: "https://" + p.nodeAddr, opToken: tok.Token, opHTTP: http.DefaultClient}
	var ca struct {
		CAHash string `json:"ca_hash"`
	}
	e.op(http.MethodGet, "/api/v1/ca", nil, &ca)
	bt := e.createHost(durabilityNode)
	agentEnv := []string{"NODE_AGENT_CONTROL_PLANE_URL=" + e.nodeURL, "NODE_AGENT_HOST_ID=" + durabilityNode,
		"NODE_AGENT_BOOTSTRAP_TOKEN=" + bt.Token, "NODE_AGENT_CA_HASH=" + ca.CAHash,
		"NODE_AGENT_STATE_DIR=" + filepath.Join(dir, "agent-state"), "NODE_AGENT_LISTEN=127.0.0.1:0",
		"NODE_AGENT_RUNTIME=none", "NODE_AGENT_HEARTBEAT_INTERVAL=200ms", "DROVER_LOG_FORMAT=json"}
	ag := startAgentProc(t, agentBin, agentEnv, agentLog)

	// The operator's client: no keep-alive reuse across kills, and a
	// timeout long enough that an error means the server died (a POST that
	// failed either committed before the kill or never will).
	c := &client{base: e.opURL, token: tok.Token,
		http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}

	// Enqueue in the background, paced over the window; kill in the
	// foreground.
	type enq struct {
		ids []string
		err error
	}
	enqDone := make(chan enq, 1)
	go func() {
		var r enq
		pace := durabilityWindow * 8 / 10 / durabilityTasks
		for i := range durabilityTasks {
			id, err := c.enqueueOnce(seed, i)
			if err != nil {
				r.err = err
				break
			}
			r.ids = append(r.ids, id)
			time.Sleep(pace)
		}
		enqDone <- r
	}()

	type kill struct {
		at    time.Duration
		agent bool
		down  time.Duration
	}
	var kills []kill
	for i := range 2 * durabilityKills {
		kills = append(kills, kill{at: 300*time.Millisecond + time.Duration(rng.Int64N(int64(durabilityWindow))),
			agent: i%2 == 1, down: time.Duration(rng.Int64N(int64(800 * time.Millisecond)))})
	}
	slices.SortFunc(kills, func(a, b kill) int { return int(a.at - b.at) })
	t0 := time.Now()
	for _, k := range kills {
		time.Sleep(time.Until(t0.Add(k.at)))
		if k.agent {
			t.Logf("%s: kill -9 drover-agent, down %s", time.Since(t0).Round(time.Millisecond), k.down.Round(time.Millisecond))
			ag.kill9()
			time.Sleep(k.down)
			ag = startAgentProc(t, agentBin, agentEnv, agentLog)
		} else {
			t.Logf("%s: kill -9 drover server, down %s", time.Since(t0).Round(time.Millisecond), k.down.Round(time.Millisecond))
			p.kill9()
			time.Sleep(k.down)
			p.start()
		}
	}
	r := <-enqDone
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("%d tasks enqueued, %d kills done after %s", len(r.ids), len(kills), time.Since(t0).Round(time.Millisecond))

	// Everything reaches a final state: a delivery lost to a kill is
	// requeued after diag.echo's lease (40s).
	var final []api.Task
	deadline := time.Now().Add(100 * time.Second)
	for {
		ts, err := c.listTasks()
		if err != nil {
			t.Fatal(err)
		}
		open := 0
		for _, tk := range ts {
			if !tk.State.Terminal() {
				open++
			}
		}
		if open == 0 && len(ts) >= len(r.ids) {
			final = ts
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d tasks not final after %s", open, len(ts), time.Since(t0).Round(time.Second))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("all %d tasks final %s after the first enqueue", len(final), time.Since(t0).Round(time.Millisecond))
	runs := handlerRuns(t, agentLog)
	checkDurability(t, seed, final, r.ids, runs)

	// Stable: the agent's spool may still re-post results; nothing moves.
	time.Sleep(2 * time.Second)
	again, err := c.listTasks()
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]api.Task{}
	for _, tk := range final {
		byID[tk.ID] = tk
	}
	for _, tk := range again {
		was := byID[tk.ID]
		a, _ := json.Marshal(was.Result)
		b, _ := json.Marshal(tk.Result)
		if was.State != tk.State || !was.FinishedAt.Equal(*tk.FinishedAt) || !bytes.Equal(a, b) {
			t.Errorf("task %s changed after it was final: %s %s -> %s %s", tk.ID, was.State, a, tk.State, b)
		}
	}
	audit, err := c.auditResults()
	if err != nil {
		t.Fatal(err)
	}
	perTask := map[string]int{}
	for _, ev := range audit {
		if ev.Result == "refused" && strings.Contains(ev.Detail, "another result") {
			t.Errorf("a second, different result was posted for %s: %s", ev.Target, ev.Detail)
		}
		if ev.Result == string(api.TaskSucceeded) || ev.Result == string(api.TaskFailed) {
			perTask[ev.Target]++
		}
	}
	reposts := 0
	for _, n := range perTask {
		reposts += max(n-1, 0)
	}
	t.Logf("%s: %d task.result audit records for %d tasks (%d idempotent re-posts of an applied result); wall %s",
		backend, len(audit), len(perTask), reposts, time.Since(start).Round(time.Millisecond))
}

// checkDurability checks the final tasks against the enqueued ids and the
// handler runs counted in the agent's log.
func checkDurability(t *testing.T, seed uint64, final []api.Task, ids []string, runs map[string]int) {
	t.Helper()
	byCID := map[string][]api.Task{}
	for _, tk := range final {
		byCID[tk.CorrelationID] = append(byCID[tk.CorrelationID], tk)
	}
	if len(final) != durabilityTasks || len(ids) != durabilityTasks {
		t.Errorf("%d tasks stored, %d enqueued, want %d", len(final), len(ids), durabilityTasks)
	}
	states := map[string]int{}
	for i := range durabilityTasks {
		cid := durabilityCID(seed, i)
		ts := byCID[cid]
		if len(ts) != 1 {
			t.Errorf("correlation id %s names %d tasks, want 1", cid, len(ts))
			continue
		}
		tk := ts[0]
		if tk.ID != ids[i] {
			t.Errorf("task %d is %s, enqueue answered %s", i, tk.ID, ids[i])
		}
		if n := runs[tk.ID]; n > 1 {
			t.Errorf("task %s: the handler ran %d times", tk.ID, n)
		}
		switch {
		case tk.Result == nil:
			t.Errorf("task %s is %s without a result", tk.ID, tk.State)
		case tk.State == api.TaskSucceeded:
			var o task.EchoOutput
			if err := json.Unmarshal(tk.Result.Output, &o); err != nil || o.Message != durabilityMessage(i) || o.NodeID != durabilityNode {
				t.Errorf("task %s succeeded with %s, want the echo of %q (%v)", tk.ID, tk.Result.Output, durabilityMessage(i), err)
			}
			if runs[tk.ID] != 1 {
				t.Errorf("task %s succeeded but the agent's log shows %d handler runs", tk.ID, runs[tk.ID])
			}
			states["succeeded"]++
		case tk.State == api.TaskFailed && tk.Result.Error != nil && tk.Result.Error.Code == "agent_restarted_during_task":
			states["failed: agent_restarted_during_task"]++
		default:
			t.Errorf("task %s ended %s %+v: not an acceptable final state", tk.ID, tk.State, tk.Result)
		}
		if tk.Attempts > 1 {
			states["delivered more than once"]++
		}
	}
	t.Logf("final states: %v", states)
}

func durabilityCID(seed uint64, i int) string { return fmt.Sprintf("dur-%d-%04d", seed, i) }
func durabilityMessage(i int) string          { return fmt.Sprintf("message %d", i) }

// handlerRuns counts the agent's "running task" lines (logged right before
// the handler runs) per task id, across all the agent's lives.
func handlerRuns(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Msg    string `json:"msg"`
			TaskID string `json:"task_id"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "running task" {
			runs[l.TaskID]++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return runs
}

// client calls the operator API and returns errors instead of failing the
// test: the server may be dead.
type client struct {
	base, token string
	http        *http.Client
}

func (c *client) do(method, path string, in, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.base+path, body)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if out != nil && resp.StatusCode < 300 && len(raw) > 0 {
		return resp.StatusCode, json.Unmarshal(raw, out)
	}
	return resp.StatusCode, nil
}

// enqueueOnce queues task i exactly once: after a failed POST it looks the
// correlation id up before posting again.
func (c *client) enqueueOnce(seed uint64, i int) (string, error) {
	cid := durabilityCID(seed, i)
	params, _ := json.Marshal(task.EchoParams{Message: durabilityMessage(i)})
	req := api.EnqueueTaskRequest{NodeID: durabilityNode, Type: task.TypeEcho, Params: params,
		TTL: api.Duration(30 * time.Minute), CorrelationID: cid}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var tk api.Task
		st, err := c.do(http.MethodPost, "/api/v1/tasks", req, &tk)
		if err == nil && st == http.StatusCreated {
			return tk.ID, nil
		}
		if err == nil && st != http.StatusServiceUnavailable {
			return "", fmt.Errorf("enqueue %s: HTTP %d", cid, st)
		}
		for time.Now().Before(deadline) {
			var ts []api.Task
			st, err := c.do(http.MethodGet, "/api/v1/tasks?correlation_id="+url.QueryEscape(cid), nil, &ts)
			if err == nil && st == http.StatusOK {
				if len(ts) == 1 {
					return ts[0].ID, nil
				}
				if len(ts) > 1 {
					return "", fmt.Errorf("enqueue %s: %d tasks", cid, len(ts))
				}
				break // not stored: post again
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return "", fmt.Errorf("enqueue %s: the control plane did not come back within 60s", cid)
}

func (c *client) listTasks() ([]api.Task, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ts []api.Task
		st, err := c.do(http.MethodGet, "/api/v1/tasks?node_id="+durabilityNode+"&limit=100000", nil, &ts)
		if err == nil && st == http.StatusOK {
			return ts, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("list tasks: HTTP %d: %w", st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *client) auditResults() ([]api.AuditEvent, error) {
	var evs []api.AuditEvent
	st, err := c.do(http.MethodGet, "/api/v1/audit?action=task.result&limit=100000", nil, &evs)
	if err == nil && st != http.StatusOK {
		err = fmt.Errorf("HTTP %d", st)
	}
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return evs, nil
}
