package diag

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
)

// fsUsage is a filesystem's size in bytes; free is what an unprivileged
// writer can still use (statfs f_bavail), used excludes reserved blocks.
type fsUsage struct{ total, free, used uint64 }

func (p *Prober) rootFSPhase(ctx context.Context, _ Params) (Check, func(*Report)) {
	path := p.cfg.RootPath
	u, err := p.statFS(ctx, path)
	if err != nil {
		return Check{Reason: ReasonRootFSUnavailable, Detail: err.Error()}, func(r *Report) { r.RootFS.Path = path }
	}
	st := rootFSStatus(path, u)
	apply := func(r *Report) { r.RootFS = st }
	if st.Full {
		return Check{Reason: ReasonDiskFull, Detail: fmt.Sprintf("%s is full: %.2f%% used, %.2f GB free", path, st.UsedPercent, st.FreeGB)}, apply
	}
	return Check{OK: true}, apply
}

func rootFSStatus(path string, u fsUsage) RootFSStatus {
	st := RootFSStatus{
		Path:    path,
		TotalGB: gb(u.total),
		UsedGB:  gb(u.used),
		FreeGB:  gb(u.free),
	}
	// Like df: the share of the space available to users that is in use.
	if u.used+u.free > 0 {
		st.UsedPercent = round2(float64(u.used) / float64(u.used+u.free) * 100)
	}
	st.Full = st.UsedPercent >= FullPercent || u.free < FullFreeBytes
	return st
}

func gb(b uint64) float64 { return round2(float64(b) / (1 << 30)) }

func round2(f float64) float64 { return math.Round(f*100) / 100 }

func (p *Prober) diagPathPhase(_ context.Context, params Params) (Check, func(*Report)) {
	path := params.DiagnosticPath
	if path == "" {
		path = p.cfg.DefaultDiagnosticPath
	}
	st := DiagnosticPathStatus{Path: path}
	apply := func(r *Report) { r.DiagnosticPath = st }
	if path == "" {
		st.Error = "no diagnostic path configured"
		return Check{Reason: ReasonDiagnosticPathUnset, Detail: st.Error}, apply
	}
	if !filepath.IsAbs(path) {
		st.Error = "diagnostic path must be absolute"
		return Check{Reason: ReasonDiagnosticPathInvalid, Detail: st.Error}, apply
	}
	st.Path = filepath.Clean(path)
	if err := p.writeProbe(st.Path); err != nil {
		st.Error = describeWriteError(err)
		return Check{Reason: ReasonDiagnosticPathNotWritable, Detail: fmt.Sprintf("%s: %s", st.Path, st.Error)}, apply
	}
	st.Writable = true
	return Check{OK: true}, apply
}

// writeProbeFile proves dir takes a durable write: it creates a temporary
// file, writes a block, fsyncs, closes and removes it.
func writeProbeFile(dir string) (err error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stat diagnostic path: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("diagnostic path %s: %w", dir, errNotDir)
	}
	f, err := os.CreateTemp(dir, ".drover-health-*.tmp")
	if err != nil {
		return fmt.Errorf("create probe file: %w", err)
	}
	name := f.Name()
	defer func() {
		if rerr := os.Remove(name); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
			err = fmt.Errorf("remove probe file: %w", rerr)
		}
	}()
	if _, err := f.Write(make([]byte, 4096)); err != nil {
		_ = f.Close()
		return fmt.Errorf("write probe file: %w", err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("fsync probe file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close probe file: %w", err)
	}
	return nil
}

// errNotDir is a sentinel compared with errors.Is; it is never modified.
var errNotDir = errors.New("not a directory")

// describeWriteError names the common causes plainly so that an operator
// reading the result sees "no space left on device", not an errno.
func describeWriteError(err error) string {
	switch {
	case isNoSpace(err):
		return "no space left on device"
	case isQuota(err):
		return "disk quota exceeded"
	case isReadOnly(err):
		return "read-only file system"
	case errors.Is(err, fs.ErrPermission):
		return "permission denied"
	case errors.Is(err, fs.ErrNotExist):
		return "no such directory"
	case errors.Is(err, errNotDir):
		return "not a directory"
	}
	return err.Error()
}
