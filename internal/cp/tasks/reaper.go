package tasks

import (
	"context"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
)

// Reap requeues tasks whose lease ended and expires overdue ones.
func (s *Room) Reap(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		requeued, expired, err := s.store.ReapTasks(ctx, s.cfg.Now())
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("reap tasks", "err", err)
			}
			continue
		}
		for _, t := range requeued {
			s.metrics.Requeued.Inc()
			s.audit.Record(ctx, audit.Entry{Actor: "system", Action: "task.requeue", Target: t.ID,
				Result: "lease_expired", CID: t.CorrelationID, Detail: fmt.Sprintf("node=%s attempts=%d", t.NodeID, t.Attempts)})
		}
		for _, t := range expired {
			s.taskFinished(ctx, t)
			s.metrics.Expired.Inc()
			s.audit.Record(ctx, audit.Entry{Actor: "system", Action: "task.expire", Target: t.ID,
				Result: "expired", CID: t.CorrelationID, Detail: "node=" + t.NodeID})
		}
	}
}
