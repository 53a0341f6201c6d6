package tasks

import (
	"context"

	"github.com/drover-dev/drover/internal/cp/periodic"
)

// RunFallback is the claim long-polls' safety net for lost change events
// (a notification committed while PostgreSQL's LISTEN connection was down,
// a subscriber that fell behind): every Config.FallbackPoll, while any
// long-poll is parked here, it reads which nodes have a claimable task (one
// statement) and wakes those. A task therefore waits at most about one
// interval for a parked agent, whatever happened to its event. It returns
// when ctx ends.
func (s *Room) RunFallback(ctx context.Context) {
	if s.cfg.FallbackPoll <= 0 {
		return
	}
	periodic.Run(ctx, s.cfg.FallbackPoll, s.log, "long-poll fallback: read queued tasks", func(ctx context.Context) error {
		if s.waiters.Count() == 0 && s.waiters.QuietCount() == 0 {
			return nil
		}
		nodes, err := s.store.QueuedTaskNodes(ctx, s.cfg.Now().UTC())
		if err != nil {
			return err
		}
		for _, n := range nodes {
			s.waiters.Wake(n)
		}
		return nil
	})
}
