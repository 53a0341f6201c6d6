package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// SweepOrphans is one pass of the orphan-overlay safety loop:
// every file in OverlayDir that belongs to no known instance (neither in
// memory nor with a state directory) and is older than OrphanGrace is
// removed, logged with its age and reported to OnOrphanRemoved. It returns
// the removed paths.
func (r *Runtime) SweepOrphans(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(r.overlayDir)
	if err != nil {
		return nil, fmt.Errorf("sweep orphans: %w", err)
	}
	now := r.now()
	var removed []string
	var errs []error
	for _, e := range entries {
		if ctx.Err() != nil {
			return removed, ctx.Err()
		}
		if e.IsDir() {
			continue
		}
		name := e.Name()
		path := filepath.Join(r.overlayDir, name)
		if id, ok := strings.CutSuffix(name, ".qcow2"); ok && r.owned(id) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // gone meanwhile
		}
		age := now.Sub(fi.ModTime())
		if age < r.opts.OrphanGrace {
			continue
		}
		// Check again under the id's lock: a Create may have just begun.
		if id, ok := strings.CutSuffix(name, ".qcow2"); ok {
			unlock := r.lockID(id)
			owned := r.owned(id)
			if !owned {
				err = os.Remove(path)
			}
			unlock()
			if owned {
				continue
			}
		} else {
			err = os.Remove(path)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("sweep orphans: %w", err))
			continue
		}
		r.log.Warn("removed orphan overlay", "path", path, "age", age.Round(time.Second).String())
		removed = append(removed, path)
		if r.opts.OnOrphanRemoved != nil {
			r.opts.OnOrphanRemoved(path)
		}
	}
	return removed, errors.Join(errs...)
}

// owned reports whether id is a known instance or has a state directory.
func (r *Runtime) owned(id string) bool {
	if !runtime.ValidID(id) {
		return false
	}
	if r.get(id) != nil {
		return true
	}
	_, err := os.Stat(filepath.Join(r.instDir, id))
	return err == nil
}

// RunOrphanLoop sweeps every interval until ctx ends.
func (r *Runtime) RunOrphanLoop(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := r.SweepOrphans(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("orphan overlay sweep", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
