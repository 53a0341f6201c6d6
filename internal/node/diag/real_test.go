package diag

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
)

// TestProbeRealHost runs the probe against this machine. It expects no GPUs
// unless DROVER_TEST_GPU_COUNT says how many the machine has.
func TestProbeRealHost(t *testing.T) {
	if testing.Short() {
		t.Skip("touches the real host")
	}
	wantGPUs := testutil.ExpectedGPUs(t)
	p := NewProber(Config{DefaultDiagnosticPath: t.TempDir()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := p.Probe(ctx, Params{}, func(phase string, d time.Duration, err error) {
		t.Logf("phase %-15s %8s err=%v", phase, d, err)
	})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("report:\n%s", out)
	if rep.KernelVersion == "" {
		t.Error("kernel version empty")
	}
	if rep.MemTotalMB <= 256 {
		t.Errorf("MemTotalMB = %d, want > 256", rep.MemTotalMB)
	}
	if rep.RootFS.TotalGB <= 0 {
		t.Errorf("root fs total = %v GB, want > 0", rep.RootFS.TotalGB)
	}
	if !rep.DiagnosticPath.Writable {
		t.Errorf("diagnostic path not writable: %+v", rep.DiagnosticPath)
	}
	if rep.GPUs.Count != wantGPUs {
		t.Errorf("GPU count = %d, want %d (set DROVER_TEST_GPU_COUNT on GPU hosts): %+v", rep.GPUs.Count, wantGPUs, rep.GPUs.Devices)
	}
}
