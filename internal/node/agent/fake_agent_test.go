package agent_test

// Agents for agent-level tests: a real agent.Run against the fake control
// plane, its handlers and logs, and the polling helpers.

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
)

// fixedAccel is an accelerator probe that reports only the named ones as
// working (the real probe boots a KVM guest; internal/node/accel tests it).
func fixedAccel(working ...string) func(context.Context) (accel.Result, error) {
	return func(context.Context) (accel.Result, error) {
		var r accel.Result
		for _, n := range accel.Names() {
			st := accel.Status{Name: n, Reason: "test_fixture"}
			if slices.Contains(working, n) {
				st.Works, st.Reason = true, accel.ReasonOK
				r.Working = append(r.Working, n)
			}
			r.Accelerators = append(r.Accelerators, st)
		}
		return r, nil
	}
}

// eventually polls cond every few milliseconds until it holds or the
// deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", waitDeadline, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// counter is a task handler that counts its runs.
type counter struct {
	runs atomic.Int64
	mu   sync.Mutex
	ids  []string
}

func (c *counter) handlers() agent.Handlers {
	return agent.Handlers{testTaskType: {Timeout: 5 * time.Second, Run: func(_ context.Context, tk agent.Task) (agent.Outcome, error) {
		c.runs.Add(1)
		c.mu.Lock()
		c.ids = append(c.ids, tk.ID)
		c.mu.Unlock()
		tk.Progress("work", 3*time.Millisecond, nil)
		return agent.Outcome{Output: map[string]any{"task_id": tk.ID, "params": tk.Params},
			Timings: map[string]int64{"work_ms": 3}}, nil
	}}}
}

// runningAgent is an agent.Run in a goroutine.
type runningAgent struct {
	*agent.Agent
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // what Run returned, once done is closed
	once   sync.Once
}

func (r *runningAgent) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// stop cancels the agent and waits for Run to return.
func (r *runningAgent) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
			if r.err != nil {
				t.Errorf("agent Run returned %v", r.err)
			}
		case <-time.After(waitDeadline):
			t.Errorf("agent did not stop within %s", waitDeadline)
		}
	})
}

// startAgent runs a real agent against f with state in stateDir and waits
// until it has heartbeated once (so it is enrolled and all loops run).
func startAgent(t *testing.T, f *fakeCP, stateDir string, h agent.Handlers, opts ...agent.Option) *runningAgent {
	t.Helper()
	return startAgentConfig(t, f, testConfig(f, stateDir), h, opts...)
}

// testConfig is the configuration startAgent runs with: no instances.
func testConfig(f *fakeCP, stateDir string) agent.Config {
	return agent.Config{ControlPlaneURL: f.srv.URL, HostID: testNodeID, BootstrapToken: testToken,
		CAHash: f.ca.Hash(), OSFamily: api.OSLinux, StateDir: stateDir, ListenAddr: "127.0.0.1:0",
		HeartbeatInterval: 100 * time.Millisecond}
}

// startAgentConfig is startAgent with a configuration of the test's own.
func startAgentConfig(t *testing.T, f *fakeCP, cfg agent.Config, h agent.Handlers, opts ...agent.Option) *runningAgent {
	t.Helper()
	logs := &testutil.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs.String())
		}
	})
	a, err := agent.New(cfg, append([]agent.Option{agent.WithHandlers(h), agent.WithAccelProbe(fixedAccel(accel.TCG)),
		agent.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))}, opts...)...)
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	if a.NodeID() != testNodeID {
		t.Fatalf("NodeID() = %q, want %q", a.NodeID(), testNodeID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{Agent: a, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = a.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { r.stop(t) })
	before := len(f.heartbeatLog())
	eventually(t, "the agent's first heartbeat", func() bool {
		if r.exited() {
			t.Fatalf("agent Run returned early: %v", r.err)
		}
		return len(f.heartbeatLog()) > before
	})
	return r
}
