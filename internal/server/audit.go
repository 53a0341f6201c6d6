package server

import (
	"context"

	"github.com/drover-dev/drover/internal/store"
)

// auditEntry is one audit record before it is stored.
type auditEntry struct {
	actor, action, target, result, cid, detail string
}

// audit appends to the audit log. A failure is logged, never returned: the
// action it describes has already happened.
func (s *Server) audit(ctx context.Context, e auditEntry) {
	err := s.store.AppendAudit(context.WithoutCancel(ctx), store.AuditEvent{
		At: s.cfg.Now().UTC(), Actor: e.actor, Action: e.action, Target: e.target,
		Result: e.result, CorrelationID: e.cid, Detail: e.detail,
	})
	if err != nil {
		s.log.Error("append audit", "err", err, "action", e.action, "target", e.target, "correlation_id", e.cid)
	}
}
