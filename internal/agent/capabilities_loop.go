package agent

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"time"
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
		b, _ := json.Marshal(caps)
		sum := sha256.Sum256(b)
		wait := capabilitiesInterval
		if sum != last {
			if _, err := a.node.do(ctx, http.MethodPut, a.node.nodePath("/capabilities"), "", caps, nil); err != nil {
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
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
