package agent

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime/debug"
	"slices"
	"time"

	"github.com/drover-dev/drover/internal/node/exepages"
	"github.com/drover-dev/drover/internal/wire/api"
)

// capabilitiesInterval is how often the agent re-reads its host facts.
const capabilitiesInterval = 5 * time.Minute

// capabilitiesLoop reports capabilities once after start (they may have
// changed while the agent was down) and then whenever they change.
func (a *Agent) capabilitiesLoop(ctx context.Context) error {
	var last [32]byte
	bo := newBackoff(time.Second, time.Minute)
	for {
		caps := a.capabilities(ctx)
		sum := stableHash(caps)
		wait := capabilitiesInterval
		if sum != last {
			if err := a.node.PutCapabilities(ctx, a.node.node(), caps); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				a.log.Warn("report capabilities", "err", err)
				wait = max(bo.next(), retryAfter(err))
			} else {
				last = sum
				bo.reset()
			}
		}
		// Reading the host is the idle agent's largest allocation burst,
		// and the first one comes right after enrolment and the
		// accelerator probe (WithMemoryRelease).
		if a.releaseMemory != nil {
			a.releaseMemory(a.log)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// ReleaseMemory hands back to the OS what an idle drover-agent process does
// not use (docs/performance.md, "Agent idle RSS and CPU"): the Go heap's
// free pages, now rather than as headroom until the scavenger gets to
// them (one collection, about a millisecond), and the pages of the
// executable that start-up (package inits, enrolment, probes) and the host
// reading touched: unmapped and dropped from the page cache, they come
// back page by page as the steady state uses them (exepages.Trim). It
// acts on the whole process, so only the agent's own binary passes it
// (WithMemoryRelease).
func ReleaseMemory(log *slog.Logger) {
	debug.FreeOSMemory()
	if res, err := exepages.Trim(); err == nil {
		log.Debug("unmapped start-up pages of the executable", "bytes", res.Bytes, "mappings", res.Mappings, "evicted", res.Evicted)
	} else if !errors.Is(err, exepages.ErrUnsupported) {
		log.Debug("unmap start-up pages of the executable", "err", err)
	}
}

// stableHash fingerprints capabilities without the fields that change on
// their own (collection time, free memory, filesystem usage), so a host is
// re-reported when its hardware or configuration changes, not every cycle.
func stableHash(c api.Capabilities) [32]byte {
	if c.Inventory != nil {
		inv := *c.Inventory
		inv.CollectedAt = time.Time{}
		inv.Memory.AvailableBytes, inv.Memory.FreeBytes, inv.Memory.AvailableMiB = 0, 0, 0
		inv.Filesystems = slices.Clone(inv.Filesystems)
		for i := range inv.Filesystems {
			inv.Filesystems[i].UsedBytes, inv.Filesystems[i].FreeBytes, inv.Filesystems[i].UsedPercent = 0, 0, 0
		}
		c.Inventory = &inv
	}
	b, _ := json.Marshal(c)
	return sha256.Sum256(b)
}
