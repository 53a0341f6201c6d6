package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// echoType is a test-only task type: the agent returns its params.
const echoType = "test.echo"

func withEcho(c *server.Config) {
	reg, err := task.NewRegistry(append(task.Builtin(), task.Spec{Type: echoType, Timeout: 10 * time.Second, Meaning: "test echo",
		Validate: func(json.RawMessage) []api.FieldError { return nil }})...)
	if err != nil {
		panic(err)
	}
	c.Registry = reg
}

// counter counts handler invocations per task id.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
}

func (c *counter) handlers() agent.Handlers {
	return agent.Handlers{echoType: {Timeout: 10 * time.Second, Run: func(_ context.Context, t agent.Task) (agent.Outcome, error) {
		c.mu.Lock()
		c.runs[t.ID]++
		c.mu.Unlock()
		return agent.Outcome{Output: json.RawMessage(t.Params)}, nil
	}}}
}

// TestTwoReplicasOnePostgres: 1,000 tasks to 20 agents spread across two
// replicas sharing one PostgreSQL; every task gets exactly one result and
// runs exactly once. Enqueues on one replica wake long-polls held by the
// other through LISTEN/NOTIFY.
func TestTwoReplicasOnePostgres(t *testing.T) {
	if pg == nil {
		pgtest.Skip(t, pgErr)
	}
	dsn := pg.NewDatabase(t)
	r1 := startEnv(t, openPostgresDSN(t, dsn), withEcho)
	r2 := startEnv(t, openPostgresDSN(t, dsn), withEcho)
	replicas := []*env{r1, r2}

	const agents, tasks = 20, 1000
	c := &counter{runs: map[string]int{}}
	for i := 0; i < agents; i++ {
		id := fmt.Sprintf("node-%02d", i)
		home := replicas[i%2] // agents connect to alternating replicas
		bt := r1.createHost(id)
		home.startAgent(id, bt.Token, agentOpts{handlers: c.handlers()})
	}
	for i := 0; i < agents; i++ {
		r1.waitHostStatus(fmt.Sprintf("node-%02d", i), api.HostHealthy, 20*time.Second)
	}

	ids := make([]string, 0, tasks)
	for i := 0; i < tasks; i++ {
		// Enqueue on the replica the agent is NOT connected to half the time.
		via := replicas[(i/agents)%2]
		tk := via.enqueue(fmt.Sprintf("node-%02d", i%agents), echoType, map[string]int{"n": i})
		ids = append(ids, tk.ID)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, id := range ids {
		got := r2.waitTask(id, time.Until(deadline))
		if got.State != api.TaskSucceeded {
			t.Fatalf("task %s: %s %+v", id, got.State, got.Result)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.runs) != tasks {
		t.Fatalf("%d distinct tasks ran, want %d", len(c.runs), tasks)
	}
	for id, n := range c.runs {
		if n != 1 {
			t.Errorf("task %s ran %d times", id, n)
		}
	}
	var done []api.Task
	r1.op(http.MethodGet, "/api/v1/tasks?state=succeeded&limit=5000", nil, &done)
	if len(done) != tasks {
		t.Fatalf("%d succeeded tasks listed, want %d", len(done), tasks)
	}
}

// TestQuietNodeWokenAcrossReplicas: a node whose waits on replica 1 found
// nothing parks the next one there without a claim (quiet); a task queued
// through replica 2, whose change event reaches replica 1 through
// PostgreSQL, is delivered at once, whether the event comes while the wait
// is parked or between two waits. The fallback check is off, so only the
// event can deliver it before the wait's deadline.
func TestQuietNodeWokenAcrossReplicas(t *testing.T) {
	if pg == nil {
		pgtest.Skip(t, pgErr)
	}
	dsn := pg.NewDatabase(t)
	noFallback := func(c *server.Config) { withEcho(c); c.LongPollFallback = time.Hour }
	r1 := startEnv(t, openPostgresDSN(t, dsn), noFallback)
	r2 := startEnv(t, openPostgresDSN(t, dsn), noFallback)
	n := r1.enroll("node-q", r1.createHost("node-q").Token)
	wait := func(timeout string) (int, time.Duration) {
		t.Helper()
		start := time.Now()
		st, code, body := r1.nodeCall(n.client, http.MethodGet, nodePath("node-q", "/tasks/wait?timeout="+timeout), nil)
		if st != http.StatusOK && st != http.StatusNoContent {
			t.Fatalf("wait: %d %s %s", st, code, body)
		}
		return st, time.Since(start)
	}
	for range 2 { // the second parks without a claim
		if st, _ := wait("200ms"); st != http.StatusNoContent {
			t.Fatalf("wait with nothing queued: %d", st)
		}
	}
	go func() {
		time.Sleep(300 * time.Millisecond) // the wait below is parked by then
		r2.enqueue("node-q", echoType, map[string]int{"n": 1})
	}()
	if st, took := wait("20s"); st != http.StatusOK || took > 3*time.Second {
		t.Fatalf("task queued on replica 2 during a quiet wait: %d after %s", st, took)
	}
	if st, _ := wait("200ms"); st != http.StatusNoContent { // claims, finds nothing: quiet again
		t.Fatalf("wait with nothing queued: %d", st)
	}
	r2.enqueue("node-q", echoType, map[string]int{"n": 2})
	time.Sleep(500 * time.Millisecond) // the event reaches replica 1 between two waits
	if st, took := wait("20s"); st != http.StatusOK || took > 3*time.Second {
		t.Fatalf("task queued on replica 2 between waits: %d after %s", st, took)
	}
}
