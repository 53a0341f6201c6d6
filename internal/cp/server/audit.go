package server

import (
	"context"

	"github.com/drover-dev/drover/internal/cp/store"
)

// auditEntry is one audit record before it is stored.
type auditEntry struct {
	actor, action, target, result, cid, detail string
}

// audit appends to the audit log. A failure is logged, never returned: the
// action it describes has already happened. An entry whose actor is the
// request's operator token ("operator:<name>") also records that token's id
// and role; entries by others ("system", "node:...") in the same request
// do not.
func (s *Server) audit(ctx context.Context, e auditEntry) {
	ev := store.AuditEvent{
		At: s.cfg.Now().UTC(), Actor: e.actor, Action: e.action, Target: e.target,
		Result: e.result, CorrelationID: e.cid, Detail: e.detail,
	}
	if p, ok := principalFrom(ctx); ok && e.actor == p.actor() {
		ev.ActorTokenID, ev.ActorRole = p.tokenID, p.role
	}
	err := s.store.AppendAudit(context.WithoutCancel(ctx), ev)
	if err != nil {
		s.log.Error("append audit", "err", err, "action", e.action, "target", e.target, "correlation_id", e.cid)
	}
}
