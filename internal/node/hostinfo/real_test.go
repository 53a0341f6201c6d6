package hostinfo

import (
	"context"
	"encoding/json"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
)

// TestCollectRealHost runs Collect on this machine. It expects no GPUs
// unless DROVER_TEST_GPU_COUNT says how many the machine has.
func TestCollectRealHost(t *testing.T) {
	if testing.Short() {
		t.Skip("touches the real host")
	}
	wantGPUs := testutil.ExpectedGPUs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inv, err := Collect(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.MarshalIndent(inv, "", "  ")
	t.Logf("inventory:\n%s", out)
	if inv.Memory.TotalBytes <= 256<<20 {
		t.Errorf("memory total = %d bytes, want > 256 MiB (system memory, not the Go heap)", inv.Memory.TotalBytes)
	}
	if inv.Memory.AvailableBytes == 0 || inv.Memory.AvailableBytes > inv.Memory.TotalBytes {
		t.Errorf("memory available = %d of %d", inv.Memory.AvailableBytes, inv.Memory.TotalBytes)
	}
	if inv.CPU.Threads != runtime.NumCPU() && runtime.GOOS == "linux" {
		t.Logf("cpu threads %d != runtime.NumCPU %d (cpuset-limited?)", inv.CPU.Threads, runtime.NumCPU())
	}
	if inv.CPU.Threads < 1 || inv.CPU.Cores < 1 || inv.CPU.Sockets < 1 {
		t.Errorf("cpu = %+v", inv.CPU)
	}
	if inv.OS.KernelVersion == "" || inv.Hostname == "" || inv.OS.Arch != runtime.GOARCH {
		t.Errorf("os = %+v hostname %q", inv.OS, inv.Hostname)
	}
	if len(inv.NICs) == 0 {
		t.Error("no NICs")
	}
	if len(inv.Filesystems) == 0 {
		t.Error("no filesystems")
	}
	if len(inv.GPUs) != wantGPUs {
		t.Errorf("GPUs = %d, want %d (set DROVER_TEST_GPU_COUNT on GPU hosts): %+v", len(inv.GPUs), wantGPUs, inv.GPUs)
	}
}

// BenchmarkCollectRealHost reads this machine as the agent does every 5
// minutes, with and without a warm PCINameCache (allocs and B/op: the
// pci.ids parse is most of a reading's allocation).
func BenchmarkCollectRealHost(b *testing.B) {
	if FindPCIIDs("", os.Getenv, "/") == "" {
		b.Skip("no pci.ids on this machine")
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		cache *PCINameCache
	}{{"parse every reading", nil}, {"names cached", &PCINameCache{}}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := Config{PCINames: tc.cache}
			if _, err := Collect(ctx, cfg); err != nil { // warms the cache
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Collect(ctx, cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
