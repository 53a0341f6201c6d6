package bench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{0, 1 * time.Millisecond},
		{1, 1 * time.Millisecond},
		{50, 50 * time.Millisecond},
		{90, 90 * time.Millisecond},
		{99, 99 * time.Millisecond},
		{99.9, 100 * time.Millisecond},
		{100, 100 * time.Millisecond},
	} {
		if got := Percentile(s, tc.p); got != tc.want {
			t.Errorf("Percentile(1..100ms, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
	if got := Percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("Percentile(one) = %v, want 7", got)
	}
}

func TestSummarize(t *testing.T) {
	// Unsorted input; Summarize sorts it.
	s := []time.Duration{5 * time.Millisecond, 1 * time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond}
	got := Summarize(s)
	want := Latency{Count: 5, MeanMs: 3, P50Ms: 3, P90Ms: 5, P99Ms: 5, P999Ms: 5, MaxMs: 5}
	if got != want {
		t.Errorf("Summarize = %+v, want %+v", got, want)
	}
	if got := Summarize(nil); got != (Latency{}) {
		t.Errorf("Summarize(nil) = %+v, want zero", got)
	}
	if got := Summarize([]time.Duration{1500 * time.Microsecond}); got.P50Ms != 1.5 {
		t.Errorf("P50 of 1.5ms = %v", got.P50Ms)
	}
}

func TestMemoryCompute(t *testing.T) {
	m := MemoryReport{LongPolls: 100,
		NoConnections:   MemSample{RSSBytes: 1000_000, HeapInuseBytes: 500_000, StackInuseBytes: 100_000, Goroutines: 10},
		IdleConnections: MemSample{RSSBytes: 1500_000, HeapInuseBytes: 800_000, StackInuseBytes: 200_000, Goroutines: 210},
		LongPollsOpen:   MemSample{RSSBytes: 1600_000, HeapInuseBytes: 850_000, StackInuseBytes: 250_000, Goroutines: 310}}
	m.compute()
	if m.RSSPerLongPoll != 6000 || m.HeapStackPerLongPoll != 5000 || m.RSSPerRequest != 1000 ||
		m.HeapStackPerRequest != 1000 || m.GoroutinesPerLongPoll != 3 {
		t.Errorf("compute = %+v", m)
	}
}

func TestEvaluate(t *testing.T) {
	r := Report{
		Heartbeats: HeartbeatReport{Agents: 10, Mode: "open-loop", Count: 1, PerSec: 25000, Latency: Latency{Count: 1, P99Ms: 12}},
		Dispatch:   DispatchReport{LongPolls: 10000, Samples: 1, Latency: Latency{Count: 1, P50Ms: 2.5, P99Ms: 9}},
		Memory:     &MemoryReport{RSSPerLongPoll: 12000},
	}
	r.evaluate()
	met := map[string]bool{}
	for _, tr := range r.Targets {
		met[tr.Name] = tr.Met
	}
	want := map[string]bool{"heartbeats_per_sec": true, "heartbeat_p99": true, "dispatch_p50": false,
		"dispatch_p99": true, "server_bytes_per_idle_long_poll": false}
	for k, v := range want {
		if got, ok := met[k]; !ok || got != v {
			t.Errorf("target %s met = %v (present %v), want %v", k, got, ok, v)
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"heartbeats"`, `"per_sec"`, `"p99_ms"`, `"dispatch"`, `"throughput"`, `"memory"`, `"targets"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("report JSON lacks %s", key)
		}
	}
	if err := r.Check(); err == nil {
		t.Error("Check accepted an incomplete report")
	}
}

// TestRecorderPerSecond: samples added by several agents keep the second
// they were scheduled in, also after the whole phase's summary (which
// sorts), so a stall shows as that second's 99th percentile.
func TestRecorderPerSecond(t *testing.T) {
	var r recorder
	for agent := range 4 {
		var mine []timedSample
		for i := range 100 {
			d := time.Millisecond
			if agent == 0 && i%3 == 0 {
				d = time.Second // one agent stalled through second 0
			}
			mine = append(mine, timedSample{at: int32(i % 3), d: d + time.Duration(i)*time.Microsecond})
		}
		r.addTimed(mine)
	}
	if all := r.summary(); all.Count != 400 || all.MaxMs < 1000 {
		t.Fatalf("summary %+v, want 400 samples up to 1 s", all)
	}
	got := r.p99PerSecond(4)
	if len(got) != 4 || got[0] < 1000 || got[1] > 2 || got[2] > 2 || got[3] != 0 {
		t.Fatalf("p99 per second = %v, want [≥1000 ≈1 ≈1 0]", got)
	}
}
