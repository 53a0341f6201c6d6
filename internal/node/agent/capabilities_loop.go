package agent

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
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
		// Reading the host (the sysfs walk, pci.ids) is the idle agent's
		// largest allocation burst, and the first one comes right after
		// enrolment and the accelerator probe: hand that heap back to the
		// OS now rather than keep it as headroom until the scavenger gets
		// to it (docs/performance.md, "Agent idle RSS and CPU"). One
		// collection per cycle (5 min) costs about a millisecond.
		debug.FreeOSMemory()
		// Likewise the executable's pages that start-up (package inits,
		// enrolment, probes) and the host reading touched: unmapped and
		// dropped from the page cache, they come back page by page as the
		// steady state uses them.
		if res, err := exepages.Trim(); err == nil {
			a.log.Debug("unmapped start-up pages of the executable", "bytes", res.Bytes, "mappings", res.Mappings, "evicted", res.Evicted)
		} else if !errors.Is(err, exepages.ErrUnsupported) {
			a.log.Debug("unmap start-up pages of the executable", "err", err)
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
