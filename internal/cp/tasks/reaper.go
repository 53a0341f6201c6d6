package tasks

import (
	"context"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/periodic"
	"github.com/drover-dev/drover/internal/cp/store"
)

// Reap requeues tasks whose lease ended and expires overdue ones.
// It runs every second until ctx ends.
func (s *Room) Reap(ctx context.Context) {
	periodic.Run(ctx, time.Second, s.log, "reap tasks", s.reapOnce)
}

// reapOnce is one of Reap's passes.
func (s *Room) reapOnce(ctx context.Context) error {
	requeued, expired, err := s.store.ReapTasks(ctx, s.cfg.Now(), func(requeued, expired []store.Task) []store.AuditEvent {
		return s.reapRecords(ctx, requeued, expired)
	})
	if err != nil {
		return err
	}
	s.metrics.Requeued.Add(float64(len(requeued)))
	for _, t := range expired {
		s.taskFinished(ctx, t)
		s.metrics.Expired.Inc()
	}
	return nil
}

// reapRecords is the audit records of the tasks a reap requeued and
// expired, for the store to write with the reap.
func (s *Room) reapRecords(ctx context.Context, requeued, expired []store.Task) []store.AuditEvent {
	evs := make([]store.AuditEvent, 0, len(requeued)+len(expired))
	for _, t := range requeued {
		evs = append(evs, s.audit.Event(ctx, audit.Entry{Actor: "system", Action: "task.requeue", Target: t.ID,
			Result: "lease_expired", CID: t.CorrelationID, Detail: fmt.Sprintf("node=%s attempts=%d", t.NodeID, t.Attempts)}))
	}
	for _, t := range expired {
		evs = append(evs, s.audit.Event(ctx, audit.Entry{Actor: "system", Action: "task.expire", Target: t.ID,
			Result: "expired", CID: t.CorrelationID, Detail: "node=" + t.NodeID}))
	}
	return evs
}
