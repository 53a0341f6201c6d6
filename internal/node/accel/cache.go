package accel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"
)

// CacheFile is the name of the cached verdict in Config.CacheDir.
const CacheFile = "accel-probe.json"

// CacheTTL is how long a cached verdict lasts on an OS without a boot id
// (every OS but linux, where a verdict lasts for the boot).
const CacheTTL = 24 * time.Hour

// cacheVersion changes whenever the probe's meaning changes, so an upgraded
// agent re-probes.
const cacheVersion = 1

// CacheError is Probe's error when the verdict could not be cached.
type CacheError struct {
	Path string
	Err  error
}

func (e *CacheError) Error() string { return fmt.Sprintf("accelerator cache %s: %v", e.Path, e.Err) }
func (e *CacheError) Unwrap() error { return e.Err }

// cacheKey is what a cached verdict depends on: a change in any field means
// the host may answer differently.
type cacheKey struct {
	Version     int    `json:"version"`
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	BootID      string `json:"boot_id,omitempty"`
	QEMUPath    string `json:"qemu_path,omitempty"`
	QEMUModTime int64  `json:"qemu_mod_time,omitempty"` // unix nanoseconds
	QEMUSize    int64  `json:"qemu_size,omitempty"`
	Device      string `json:"device,omitempty"` // the hardware accelerator's device node: mode and mtime, or "absent"
	TimeoutMS   int64  `json:"timeout_ms"`
}

type cacheEntry struct {
	Key    cacheKey `json:"key"`
	Result Result   `json:"result"`
}

// cacheKey computes the current key. It fails when a verdict cannot be keyed
// (a linux host whose boot id cannot be read): nothing is cached then.
func (p *Prober) cacheKey() (cacheKey, error) {
	c := p.cfg
	k := cacheKey{Version: cacheVersion, GOOS: c.GOOS, GOARCH: c.GOARCH, TimeoutMS: c.Timeout.Milliseconds()}
	if c.GOOS == "linux" {
		b, err := os.ReadFile(filepath.Join(c.ProcRoot, "sys", "kernel", "random", "boot_id"))
		if err != nil {
			return k, fmt.Errorf("boot id: %w", err)
		}
		if k.BootID = strings.TrimSpace(string(b)); k.BootID == "" {
			return k, errors.New("boot id: empty")
		}
	}
	if path, err := c.LookPath(c.QEMU); err == nil {
		k.QEMUPath = path
		if fi, err := os.Stat(path); err == nil {
			k.QEMUModTime, k.QEMUSize = fi.ModTime().UnixNano(), fi.Size()
		}
	}
	if dev := map[string]string{KVM: "kvm", NVMM: "nvmm"}[hostAccel(c.GOOS)]; dev != "" {
		k.Device = "absent"
		if fi, err := os.Stat(filepath.Join(c.DevRoot, dev)); err == nil {
			k.Device = fmt.Sprintf("%v %d", fi.Mode(), fi.ModTime().UnixNano())
		}
	}
	return k, nil
}

func (p *Prober) cachePath() string { return filepath.Join(p.cfg.CacheDir, CacheFile) }

// ProbeCached returns the cached verdict when it is still valid (same boot on
// linux, younger than CacheTTL elsewhere, same QEMU binary and device node)
// and probes otherwise. Errors are Probe's.
func (p *Prober) ProbeCached(ctx context.Context) (Result, error) {
	if res, ok := p.Cached(); ok {
		return res, nil
	}
	return p.Probe(ctx)
}

// Cached returns the cached verdict if it is still valid. It probes nothing.
func (p *Prober) Cached() (Result, bool) {
	if p.cfg.CacheDir == "" {
		return Result{}, false
	}
	key, err := p.cacheKey()
	if err != nil {
		return Result{}, false
	}
	b, err := os.ReadFile(p.cachePath())
	if err != nil {
		return Result{}, false
	}
	var e cacheEntry
	if err := json.Unmarshal(b, &e); err != nil || e.Key != key || e.Result.ProbedAt.IsZero() {
		return Result{}, false
	}
	if key.BootID == "" {
		age := p.cfg.Now().Sub(e.Result.ProbedAt)
		if age < -time.Minute || age >= CacheTTL {
			return Result{}, false
		}
	}
	e.Result.Cached = true
	return e.Result, true
}

// store writes the verdict (mode 0600) atomically.
func (p *Prober) store(key cacheKey, keyErr error, res Result) error {
	if p.cfg.CacheDir == "" || keyErr != nil {
		return nil
	}
	path := p.cachePath()
	fail := func(err error) error { return &CacheError{Path: path, Err: err} }
	b, err := json.MarshalIndent(cacheEntry{Key: key, Result: res}, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(p.cfg.CacheDir, 0o700); err != nil {
		return fail(err)
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o600); err != nil {
		return fail(err)
	}
	return nil
}
