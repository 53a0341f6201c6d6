package accel

import (
	"context"
	"encoding/json"
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestRealProbe probes this machine for real: the KVM proof runs in a child
// (this test binary; TestMain calls MaybeRunChild). Whichever way it comes
// out, it must come out in time and make sense.
func TestRealProbe(t *testing.T) {
	const timeout = 3 * time.Second
	p := New(Config{Timeout: timeout, CacheDir: t.TempDir()})
	start := time.Now()
	res, err := p.Probe(context.Background())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("probe took %s:\n%s", took, b)
	if took > timeout+2*time.Second {
		t.Errorf("probe took %s, want at most %s", took, timeout+2*time.Second)
	}
	if len(res.Accelerators) != len(Names()) {
		t.Fatalf("got %d statuses, want %d", len(res.Accelerators), len(Names()))
	}
	for i, s := range res.Accelerators {
		if s.Name != Names()[i] {
			t.Errorf("status %d is %q, want %q", i, s.Name, Names()[i])
		}
		if s.Works != (s.Reason == ReasonOK) || s.Reason == "" {
			t.Errorf("%s: incoherent status %+v", s.Name, s)
		}
		if s.Works != slices.Contains(res.Working, s.Name) {
			t.Errorf("%s: Works %v but Working %v", s.Name, s.Works, res.Working)
		}
	}
	if runtime.GOOS == "linux" {
		kvm, _ := res.Status(KVM)
		if kvm.Reason == ReasonKVMChildFailed {
			t.Errorf("the KVM child did not give a verdict: %+v", kvm)
		}
		t.Logf("kvm verdict: works=%v reason=%s detail=%q (%d ms)", kvm.Works, kvm.Reason, kvm.Detail, kvm.DurationMS)
		if res.BootID == "" {
			t.Error("no boot id on linux")
		}
	}
	// The second call is served from the cache.
	start = time.Now()
	again, err := p.ProbeCached(context.Background())
	if err != nil || !again.Cached {
		t.Fatalf("ProbeCached: cached=%v err=%v", again.Cached, err)
	}
	t.Logf("cached probe took %s", time.Since(start))
}
