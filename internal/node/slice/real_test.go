package slice

import (
	"context"
	"encoding/json"
	"runtime"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
)

// TestDiscoverRealHost runs discovery on this machine. It expects no GPUs
// unless DROVER_TEST_GPU_COUNT says how many the machine has; with none the
// result must say so plainly.
func TestDiscoverRealHost(t *testing.T) {
	if testing.Short() {
		t.Skip("touches the real host")
	}
	if runtime.GOOS != "linux" {
		t.Skip("slice discovery scans Linux hosts only")
	}
	wantGPUs := testutil.ExpectedGPUs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topo, timings, err := NewDiscoverer(Config{HostID: "real-host"}).Discover(ctx, Params{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.MarshalIndent(topo, "", "  ")
	t.Logf("topology:\n%s\ntimings: %v", out, timings)
	if !topo.ApprovalRequired {
		t.Error("approval_required is false")
	}
	if len(topo.GPUDevices) != wantGPUs || len(topo.CandidateSlots) != wantGPUs {
		t.Errorf("%d GPUs, %d slots; want %d (set DROVER_TEST_GPU_COUNT on GPU hosts)", len(topo.GPUDevices), len(topo.CandidateSlots), wantGPUs)
	}
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatal(err)
	}
	if wantGPUs == 0 {
		if g, ok := raw["gpu_devices"].([]any); !ok || len(g) != 0 {
			t.Errorf("gpu_devices = %#v, want []", raw["gpu_devices"])
		}
		b := topo.CandidateSummary.Blockers
		if len(b) == 0 || b[0].Code != BlockerNoGPUs || b[0].SlotIndex != nil {
			t.Errorf("first blocker = %+v, want host-wide %s", b, BlockerNoGPUs)
		}
	}
	for _, ph := range []string{PhaseHost, PhaseCommands, PhaseNetwork, PhasePCI, PhaseNVMe, PhaseSlots} {
		if _, ok := timings[ph+"_ms"]; !ok {
			t.Errorf("no timing for %s", ph)
		}
	}
}
