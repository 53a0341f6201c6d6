package bench

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestFleetSmoke runs the whole harness at toy scale against an in-process
// control plane on SQLite. It checks that the report is complete; it makes
// no assertion about timings.
func TestFleetSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	var log io.Writer
	if os.Getenv("DROVER_TEST_LOG") != "" {
		log = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Agents: 20, Duration: time.Second, Tasks: 40, DispatchSamples: 10,
		Store: "sqlite:", Settle: 50 * time.Millisecond, Log: log})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := rep.Check(); err != nil {
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("incomplete report: %v\n%s", err, b)
	}
	if rep.Config.Mode != ModeInProcess || rep.Memory.Source != ModeInProcess || !rep.Memory.IncludesClients {
		t.Errorf("mode %q, memory source %q includes_clients %v", rep.Config.Mode, rep.Memory.Source, rep.Memory.IncludesClients)
	}
	if rep.Dispatch.LongPolls != 20 || rep.Heartbeats.Agents != 20 || rep.Throughput.Tasks != 40 {
		t.Errorf("scale not as configured: %+v %+v %+v", rep.Dispatch, rep.Heartbeats, rep.Throughput)
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Fatal(err)
	}
}

// TestFleetBatchEnqueue runs the throughput phase with POST
// /api/v1/tasks:batch (batches of 7 over 40 tasks, so the last one is
// short), with one task per wait and with up to 8 per wait and their
// results in one POST .../tasks/results. It checks that every task
// completes; no timings.
func TestFleetBatchEnqueue(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, claimMax := range []int{1, 8} {
		rep, err := Run(ctx, Config{Agents: 10, Duration: 200 * time.Millisecond, Tasks: 40, DispatchSamples: 2,
			Enqueue: EnqueueBatch, BatchSize: 7, ClaimMax: claimMax, Store: "sqlite:", Settle: 10 * time.Millisecond})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		tp := rep.Throughput
		if tp.Enqueue != EnqueueBatch || tp.BatchSize != 7 || tp.ClaimMax != claimMax || tp.Completed != 40 || tp.Errors != 0 ||
			rep.Config.Enqueue != EnqueueBatch {
			t.Errorf("throughput with %d tasks per wait: %+v", claimMax, tp)
		}
	}
}

func TestConfigRejectsNonLoopback(t *testing.T) {
	for _, c := range []Config{
		{NodeURL: "https://10.0.0.1:8443", API: "http://127.0.0.1:8080", Token: "x"},
		{NodeURL: "https://127.0.0.1:8443", API: "http://example.com:8080", Token: "x"},
		{NodeURL: "https://127.0.0.1:8443", API: "http://127.0.0.1:8080"},
		{NodeURL: "https://127.0.0.1:8443", API: "http://127.0.0.1:8080", Token: "x", ServerProcess: true},
		{Agents: MaxAgents + 1},
		{Enqueue: "bulk"},
		{Enqueue: EnqueueBatch, BatchSize: 1001},
		{ClaimMax: -1},
		{ClaimMax: api.MaxClaim + 1},
	} {
		if err := c.defaults(); err == nil {
			t.Errorf("defaults accepted %+v", c)
		}
	}
	ok := Config{NodeURL: "https://[::1]:8443", API: "http://localhost:8080", Token: "x"}
	if err := ok.defaults(); err != nil {
		t.Errorf("defaults refused loopback: %v", err)
	}
}

func TestSourceAddr(t *testing.T) {
	if a := sourceAddr("https://127.0.0.1:8443", 0); a == nil || a.IP.String() != "127.1.0.1" {
		t.Errorf("agent 0: %v", a)
	}
	if a := sourceAddr("https://127.0.0.1:8443", 251); a == nil || a.IP.String() != "127.1.1.2" {
		t.Errorf("agent 251: %v", a)
	}
	if a := sourceAddr("https://[::1]:8443", 0); a != nil {
		t.Errorf("IPv6 target: %v, want nil", a)
	}
}
