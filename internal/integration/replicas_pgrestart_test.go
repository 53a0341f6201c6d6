package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// wakeWithin bounds how long a task may wait for a parked agent after a
// lost or late change event. It is well under the agent's own 30 s poll,
// so only a wake-up (notification, resync or fallback) meets it, and
// generous for a loaded two-core machine.
const wakeWithin = 20 * time.Second

// TestReplicasPostgresRestart: two replicas share one PostgreSQL; a real
// agent long-polls replica B. PostgreSQL is stopped hard (immediate
// shutdown) while the agent waits and started again on the same data and
// port. Both replicas' LISTEN connections come back
// (drover_store_listen_reconnects_total, drover_store_listen_up) and a task
// enqueued through replica A reaches the agent on B. Before the restart, a
// task whose change event never existed (moved to the agent's node by a
// raw UPDATE, no NOTIFY) reaches it through the fallback poll. Every task
// runs once.
func TestReplicasPostgresRestart(t *testing.T) {
	pgs, err := pgtest.StartServer() // its own server: this test restarts it
	if err != nil {
		pgtest.Skip(t, err)
	}
	t.Cleanup(pgs.Stop)
	dsn := pgs.NewDatabase(t)
	// The long-poll cap is above the agent's 30 s poll, so a task that
	// waited for the poll to end would miss wakeWithin.
	cfg := func(c *server.Config) {
		withEcho(c)
		c.MaxWait, c.LongPollFallback = 2*time.Minute, time.Second
	}
	a := startEnv(t, openPostgresDSN(t, dsn), cfg)
	b := startEnv(t, openPostgresDSN(t, dsn), cfg)
	c := &counter{runs: map[string]int{}}
	bt := a.createHost("pg-host")
	a.createHost("pg-parked") // holds a task until the raw UPDATE moves it
	b.startAgent("pg-host", bt.Token, agentOpts{handlers: c.handlers()})
	a.waitHostStatus("pg-host", api.HostHealthy, 30*time.Second)
	first := a.enqueue("pg-host", echoType, map[string]string{"n": "before"})
	if got := b.waitTask(first.ID, 30*time.Second); got.State != api.TaskSucceeded {
		t.Fatalf("task before the restart: %s", got.State)
	}

	// No event at all: only the fallback poll can wake the agent's parked
	// long-poll.
	const parked = `drover_node_long_polls{route="tasks"}`
	waitMetricAtLeast(t, b, parked, 1, 30*time.Second)
	silent := enqueueRetry(t, a, "pg-parked", map[string]string{"n": "silent"})
	moveTaskSilently(t, dsn, silent.ID, "pg-host")
	start := time.Now()
	if got := b.waitTask(silent.ID, wakeWithin); got.State != api.TaskSucceeded || got.NodeID != "pg-host" {
		t.Fatalf("task without an event: %s on %s", got.State, got.NodeID)
	}
	t.Logf("task without a change event done in %s", time.Since(start).Round(time.Millisecond))

	waitMetricAtLeast(t, b, parked, 1, 30*time.Second)
	if err := pgs.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := pgs.Resume(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*env{a, b} {
		waitMetricAtLeast(t, r, "drover_store_listen_reconnects_total", 1, 60*time.Second)
		waitMetricAtLeast(t, r, "drover_store_listen_up", 1, 60*time.Second)
		waitReady(t, r, 60*time.Second)
	}

	// Through A after the restart: A's NOTIFY reaches B's new LISTEN
	// connection (or B's fallback finds it).
	start = time.Now()
	after := enqueueRetry(t, a, "pg-host", map[string]string{"n": "after"})
	if got := b.waitTask(after.ID, wakeWithin); got.State != api.TaskSucceeded {
		t.Fatalf("task after the restart: %s", got.State)
	}
	t.Logf("task after the PostgreSQL restart done in %s", time.Since(start).Round(time.Millisecond))

	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range []string{after.ID, silent.ID} {
		if c.runs[id] != 1 {
			t.Errorf("task %s ran %d times, want 1", id, c.runs[id])
		}
	}
}

// moveTaskSilently reassigns a queued task to node with a plain UPDATE:
// no pg_notify, so no replica hears of it.
func moveTaskSilently(t *testing.T, dsn, taskID, node string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, `UPDATE tasks SET node_id = $1 WHERE id = $2 AND state = 'queued'`, node, taskID)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("move task %s to %s: %v (%d rows)", taskID, node, err, tag.RowsAffected())
	}
}

// waitMetricAtLeast waits until a replica's series reaches min.
func waitMetricAtLeast(t *testing.T, e *env, series string, min float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := e.metric(series)
		if got >= min {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %g after %s, want at least %g", series, got, within, min)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReady waits until a replica's /readyz answers 200 (its store pool
// reconnected).
func waitReady(t *testing.T, e *env, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(e.opURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not ready after %s: %v", e.opURL, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// enqueueRetry queues an echo task, retrying while the replica answers 5xx
// (a pool connection that died with the database is found on use).
func enqueueRetry(t *testing.T, e *env, node string, params any) api.Task {
	t.Helper()
	raw, _ := json.Marshal(params)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var tk api.Task
		st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: node, Type: echoType, Params: raw}, &tk)
		if st == http.StatusCreated {
			return tk
		}
		if st < 500 || time.Now().After(deadline) {
			t.Fatalf("enqueue for %s: HTTP %d", node, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
