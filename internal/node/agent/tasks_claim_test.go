package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/agent/statedir"
	"github.com/drover-dev/drover/internal/wire/api"
)

// slots is the agent's default bound on tasks running at once
// (NODE_AGENT_TASK_SLOTS).
const slots = agent.DefaultTaskSlots

// TestWaitAsksForFreeSlots: each long-poll asks for as many tasks as the
// agent has free slots (?max=N, at most api.MaxClaim), runs every task of
// an answer at once, and never runs more than its bound: with all slots
// busy it does not poll.
func TestWaitAsksForFreeSlots(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		cfg      int // Config.TaskSlots
		slots    int // the bound it means
		firstMax int // what the first wait asks for
	}{
		{"default", 0, slots, slots},
		{"two slots", 2, 2, 2},
		{"more slots than one wait takes", api.MaxClaim + 8, api.MaxClaim + 8, api.MaxClaim},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			waitAsksForFreeSlots(t, tc.cfg, tc.slots, tc.firstMax)
		})
	}
}

func waitAsksForFreeSlots(t *testing.T, cfgSlots, slots, firstMax int) {
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
	cfg := testConfig(f, t.TempDir())
	cfg.TaskSlots = cfgSlots
	a := startAgentConfig(t, f, cfg, h)
	eventually(t, "the first wait", func() bool { return len(f.waitMaxes()) > 0 })

	var ds []api.TaskDelivery
	for i := range slots + 2 {
		c := claims(fmt.Sprintf("task-%d", i), testTaskType)
		ds = append(ds, deliveryFor(c, sign(t, f.signer, c)))
	}
	f.enqueue(ds...)
	eventually(t, "every slot running", func() bool { return running.Load() == int64(slots) })
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

	if runs.Load() != int64(len(ds)) || peak.Load() != int64(slots) {
		t.Fatalf("%d runs, at most %d at once; want %d runs, %d at once", runs.Load(), peak.Load(), len(ds), slots)
	}
	maxes := f.waitMaxes()
	if maxes[0] != firstMax {
		t.Errorf("first wait asked for %d tasks, want %d (every slot free)", maxes[0], firstMax)
	}
	if slices.ContainsFunc(maxes, func(m int) bool { return m < 1 || m > min(slots, api.MaxClaim) }) {
		t.Errorf("waits asked for %v tasks, want 1..%d each", maxes, min(slots, api.MaxClaim))
	}
}

// spooled reports whether the agent's record of taskID holds its result.
func spooled(stateDir, taskID string) bool {
	b, err := os.ReadFile(filepath.Join(stateDir, "tasks", taskID+".json"))
	var rec statedir.TaskRecord
	return err == nil && json.Unmarshal(b, &rec) == nil && rec.Result != nil
}

// TestResultsPostedTogether: results that end while a result post is in
// flight go together in the next post, one POST .../tasks/results; each is
// accepted once, byte for byte as the single route gets it, and marked
// posted. A control plane without that route (404) gets them one by one,
// and so does one that refuses the batch as a whole (413).
func TestResultsPostedTogether(t *testing.T) {
	t.Parallel()
	for _, refuse := range []int{0, http.StatusNotFound, http.StatusRequestEntityTooLarge} {
		t.Run(fmt.Sprintf("batch answered %d", refuse), func(t *testing.T) {
			t.Parallel()
			f := newFakeCP(t)
			hold := make(chan struct{})
			f.mu.Lock()
			f.holdResult, f.refuseBatches = hold, refuse
			f.mu.Unlock()
			h := &counter{}
			dir := t.TempDir()
			a := startAgent(t, f, dir, h.handlers())
			var ds []api.TaskDelivery
			for i := range slots {
				c := claims(fmt.Sprintf("task-together-%d", i), testTaskType)
				ds = append(ds, deliveryFor(c, sign(t, f.signer, c)))
			}
			f.enqueue(ds...)
			// The first result post is held; every other result is spooled
			// and waits for it.
			eventually(t, "every result spooled", func() bool {
				return !slices.ContainsFunc(ds, func(d api.TaskDelivery) bool { return !spooled(dir, d.TaskID) })
			})
			time.Sleep(50 * time.Millisecond)
			close(hold)
			for _, d := range ds {
				got := f.waitAccepted(t, d.TaskID, 1)
				waitPosted(t, dir, d.TaskID)
				var want bytes.Buffer
				if err := json.NewEncoder(&want).Encode(readTaskRecord(t, dir, d.TaskID).Result); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(append(got[0].Body, '\n'), want.Bytes()) {
					t.Errorf("task %s: posted %s, spooled %s", d.TaskID, got[0].Body, want.Bytes())
				}
			}
			// None went through the spool's retry: a refused batch is posted
			// one by one at once, not left as a failed post.
			if n := agentMetric(t, a, "drover_agent_result_post_failures_total"); n != 0 {
				t.Errorf("%v result posts failed", n)
			}
			a.stop(t)
			for _, d := range ds {
				if n := len(f.resultsFor(d.TaskID)); n != 1 {
					t.Errorf("result of %s posted %d times, want once", d.TaskID, n)
				}
			}
			// The held post took what was queued then (one result or more);
			// the next took the others.
			batches := f.batches()
			f.mu.Lock()
			attempts := f.batchAttempts
			f.mu.Unlock()
			inBatches := 0
			for _, n := range batches {
				inBatches += n
			}
			requests := len(batches) + len(ds) - inBatches
			switch {
			case refuse != 0 && len(batches) != 0:
				t.Errorf("batches %v accepted by a control plane that refuses them", batches)
			case refuse == http.StatusNotFound && attempts > 1:
				// The first 404 is remembered: no batch is tried again.
				t.Errorf("%d batches tried on a control plane without the route, want 1", attempts)
			case refuse == 0 && (len(batches) == 0 || requests >= len(ds)):
				// Usually 2 requests; a result spooled but slow to queue
				// (a loaded machine) may come in a third.
				t.Errorf("%d result requests (batches %v) for %d results, want fewer, with a batch", requests, batches, len(ds))
			}
		})
	}
}
