package agent_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/wire/api"
)

// slots is the agent's bound on tasks running at once (maxConcurrent).
const slots = 4

// TestWaitAsksForFreeSlots: each long-poll asks for as many tasks as the
// agent has free slots (?max=N), runs every task of an answer at once, and
// never runs more than its bound: with all slots busy it does not poll.
func TestWaitAsksForFreeSlots(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	gate := make(chan struct{})
	var running, peak, runs atomic.Int64
	h := agent.Handlers{testTaskType: {Timeout: 5 * time.Second, Run: func(ctx context.Context, tk agent.Task) (agent.Outcome, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		runs.Add(1)
		select {
		case <-gate:
		case <-ctx.Done():
			return agent.Outcome{}, ctx.Err()
		}
		return agent.Outcome{Output: map[string]any{"task_id": tk.ID}}, nil
	}}}
	a := startAgent(t, f, t.TempDir(), h)
	eventually(t, "the first wait", func() bool { return len(f.waitMaxes()) > 0 })

	var ds []api.TaskDelivery
	for i := range slots + 2 {
		c := claims(fmt.Sprintf("task-%d", i), testTaskType)
		ds = append(ds, deliveryFor(c, sign(t, f.signer, c)))
	}
	f.enqueue(ds...)
	eventually(t, "every slot running", func() bool { return running.Load() == slots })
	// All slots busy: no wait is in flight, the last two stay queued.
	waits := len(f.waitMaxes())
	time.Sleep(300 * time.Millisecond)
	if got := len(f.waitMaxes()); got != waits {
		t.Fatalf("the agent polled %d more times with every slot busy", got-waits)
	}
	close(gate)
	for _, d := range ds {
		if r := f.waitAccepted(t, d.TaskID, 1)[0].Result; r.Status != api.ResultSucceeded {
			t.Fatalf("task %s: %+v", d.TaskID, r)
		}
	}
	a.stop(t)

	if runs.Load() != int64(len(ds)) || peak.Load() != slots {
		t.Fatalf("%d runs, at most %d at once; want %d runs, %d at once", runs.Load(), peak.Load(), len(ds), slots)
	}
	maxes := f.waitMaxes()
	if maxes[0] != slots {
		t.Errorf("first wait asked for %d tasks, want %d (every slot free)", maxes[0], slots)
	}
	if slices.ContainsFunc(maxes, func(m int) bool { return m < 1 || m > slots }) {
		t.Errorf("waits asked for %v tasks, want 1..%d each", maxes, slots)
	}
}
