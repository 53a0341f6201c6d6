// Package periodic owns the control plane's background loops: a piece of
// work run every interval until the replica stops, its failures logged.
// The sweeps, the reaper, the long-poll fallback, the key reload, the
// health probe scheduler, the terminal recheck and the terminal session
// leases all run through it.
package periodic

import (
	"context"
	"log/slog"
	"time"
)

// Run calls fn every interval (the first call one interval after Run
// starts) until ctx ends. An error fn returns while ctx is live is logged
// at warn level as what failed; it does not stop the loop. fn's calls never
// overlap: a call that outlasts the interval delays the next one.
func Run(ctx context.Context, interval time.Duration, log *slog.Logger, what string, fn func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			log.Warn(what, "err", err)
		}
	}
}
