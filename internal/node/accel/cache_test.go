package accel

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestProbeCached(t *testing.T) {
	h := fakeHost{t: t, devices: []string{"kvm"}, binaries: []string{"qemu-system-x86_64"},
		outputs: map[string]string{"qemu-system-x86_64 -accel help": helpTCGKVM}, child: childOK}
	cfg := h.config("linux", "amd64")
	cfg.CacheDir = filepath.Join(t.TempDir(), "state")
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cfg.Now = func() time.Time { return now }
	p := New(cfg)
	ctx := context.Background()
	path := filepath.Join(cfg.CacheDir, CacheFile)

	// Miss: nothing cached yet.
	if _, ok := p.Cached(); ok {
		t.Fatal("cache hit before any probe")
	}
	first, err := p.ProbeCached(ctx)
	if err != nil || first.Cached {
		t.Fatalf("first ProbeCached: cached=%v err=%v", first.Cached, err)
	}
	calls := h.callCount()
	if calls == 0 {
		t.Fatal("the probe ran nothing")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm() != 0o600 {
		t.Errorf("cache file mode %v, want 0600", fi.Mode().Perm())
	}

	// Hit: same boot, nothing probed.
	second, err := p.ProbeCached(ctx)
	if err != nil || !second.Cached {
		t.Fatalf("second ProbeCached: cached=%v err=%v", second.Cached, err)
	}
	if h.callCount() != calls {
		t.Error("a cache hit probed")
	}
	if second.BootID != "boot-1" || !second.ProbedAt.Equal(first.ProbedAt) || Default(second) != KVM {
		t.Errorf("cached result %+v differs from %+v", second, first)
	}

	// A new boot invalidates.
	h.setBootID("boot-2")
	third, err := p.ProbeCached(ctx)
	if err != nil || third.Cached || third.BootID != "boot-2" {
		t.Fatalf("after reboot: cached=%v boot=%q err=%v", third.Cached, third.BootID, err)
	}
	if again, _ := p.ProbeCached(ctx); !again.Cached {
		t.Error("the re-probe was not cached")
	}

	// So does a new QEMU binary.
	qemu := filepath.Join(h.root, "bin", "qemu-system-x86_64")
	if err := os.Chtimes(qemu, now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if res, _ := p.ProbeCached(ctx); res.Cached {
		t.Error("a changed QEMU binary did not invalidate the cache")
	}

	// And a changed /dev/kvm (e.g. the module reloaded, permissions fixed).
	if err := os.Chmod(filepath.Join(cfg.DevRoot, "kvm"), 0o666); err != nil {
		t.Fatal(err)
	}
	if res, _ := p.ProbeCached(ctx); res.Cached {
		t.Error("a changed /dev/kvm did not invalidate the cache")
	}

	// Linux verdicts last for the boot, however old.
	now = now.Add(30 * 24 * time.Hour)
	if res, _ := p.ProbeCached(ctx); !res.Cached {
		t.Error("an old verdict of this boot was not used")
	}

	// A corrupt cache is a miss.
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err := p.ProbeCached(ctx); err != nil || res.Cached {
		t.Errorf("corrupt cache: cached=%v err=%v", res.Cached, err)
	}

	// An unreadable boot id disables the cache on linux.
	os.Remove(filepath.Join(h.root, "proc/sys/kernel/random/boot_id"))
	os.Remove(path)
	res, err := p.ProbeCached(ctx)
	if err != nil || res.Cached || res.BootID != "" {
		t.Errorf("no boot id: %+v %v", res, err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("a verdict without a boot id was cached")
	}
}

// Without a boot id (every OS but linux) a verdict lasts CacheTTL.
func TestProbeCachedTTL(t *testing.T) {
	h := fakeHost{t: t, devices: []string{"nvmm"}}
	cfg := h.config("dragonfly", "amd64")
	cfg.CacheDir = t.TempDir()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cfg.Now = func() time.Time { return now }
	p := New(cfg)
	ctx := context.Background()
	if res, err := p.ProbeCached(ctx); err != nil || res.Cached || res.BootID != "" {
		t.Fatalf("first: %+v %v", res, err)
	}
	now = now.Add(CacheTTL - time.Minute)
	if res, _ := p.ProbeCached(ctx); !res.Cached || Default(res) != NVMM {
		t.Errorf("within the TTL: %+v", res)
	}
	now = now.Add(2 * time.Minute)
	if res, _ := p.ProbeCached(ctx); res.Cached {
		t.Error("past the TTL: cached")
	}
	// A clock that went back a long way does not trust the cache either.
	now = now.Add(-48 * time.Hour)
	if res, _ := p.ProbeCached(ctx); res.Cached {
		t.Error("verdict from the future: cached")
	}
}

// The cache file is plain JSON: the key and the Result.
func TestCacheFileFormat(t *testing.T) {
	h := fakeHost{t: t}
	cfg := h.config("linux", "amd64")
	cfg.CacheDir = t.TempDir()
	if _, err := New(cfg).Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(cfg.CacheDir, CacheFile))
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Key    map[string]any `json:"key"`
		Result Result         `json:"result"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	if e.Key["boot_id"] != "boot-1" || e.Key["device"] != "absent" || e.Result.BootID != "boot-1" || e.Result.Cached {
		t.Errorf("cache file: %s", b)
	}
}

func TestCacheWriteFailure(t *testing.T) {
	h := fakeHost{t: t}
	cfg := h.config("linux", "amd64")
	file := filepath.Join(t.TempDir(), "not-a-dir")
	os.WriteFile(file, nil, 0o600)
	cfg.CacheDir = file
	res, err := New(cfg).Probe(context.Background())
	var ce *CacheError
	if !errors.As(err, &ce) {
		t.Fatalf("Probe = %v, want *CacheError", err)
	}
	checkCoherent(t, res)
}

// Verdicts on the probe's own machinery are not kept for the boot.
func TestInconclusiveNotCached(t *testing.T) {
	for name, h := range map[string]*fakeHost{
		"child failed": {t: t, devices: []string{"kvm"}, child: "garbage"},
		"qemu failed": {t: t, binaries: []string{"qemu-system-x86_64"},
			failures: map[string]error{"qemu-system-x86_64 -accel help": context.DeadlineExceeded}},
	} {
		cfg := h.config("linux", "amd64")
		cfg.CacheDir = t.TempDir()
		res, err := New(cfg).ProbeCached(context.Background())
		if err != nil || !inconclusive(res) {
			t.Errorf("%s: %+v %v", name, res, err)
		}
		if _, err := os.Stat(filepath.Join(cfg.CacheDir, CacheFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: cached (%v)", name, err)
		}
	}
}
