// Package audit is the control plane's audit log: every room records what
// it did (Record), and operators read it (GET /api/v1/audit, List).
package audit

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Store is what the audit log reads and writes: the whole audit log.
// store.Store satisfies it.
type Store interface {
	store.AuditStore
}

// Entry is one audit record before it is stored.
type Entry struct {
	Actor, Action, Target, Result, CID, Detail string
}

// Log appends to and lists the audit log.
type Log struct {
	st  Store
	now func() time.Time
	log *slog.Logger
}

// New is the audit log of st; now stamps entries, log receives failures.
func New(st Store, now func() time.Time, log *slog.Logger) *Log {
	return &Log{st: st, now: now, log: log}
}

// Record appends to the audit log. A failure is logged, never returned:
// the action it describes has already happened. An entry whose actor is
// the request's operator token ("operator:<name>") also records that
// token's id and role; entries by others ("system", "node:...") in the same
// request do not.
func (l *Log) Record(ctx context.Context, e Entry) {
	ev := store.AuditEvent{
		At: l.now().UTC(), Actor: e.Actor, Action: e.Action, Target: e.Target,
		Result: e.Result, CorrelationID: e.CID, Detail: e.Detail,
	}
	if p, ok := httpapi.PrincipalFrom(ctx); ok && e.Actor == p.Actor() {
		ev.ActorTokenID, ev.ActorRole = p.TokenID, p.Role
	}
	err := l.st.AppendAudit(context.WithoutCancel(ctx), ev)
	if err != nil {
		l.log.Error("append audit", "err", err, "action", e.Action, "target", e.Target, "correlation_id", e.CID)
	}
}

// List is GET /api/v1/audit: the newest entries, filtered by target and
// correlation id.
func (l *Log) List(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	evs, err := l.st.ListAudit(r.Context(), store.AuditFilter{Target: q.Get("target"),
		CorrelationID: q.Get("correlation_id"), Limit: limit})
	if err != nil {
		return err
	}
	out := make([]api.AuditEvent, 0, len(evs))
	for _, e := range evs {
		out = append(out, api.AuditEvent{ID: e.ID, At: e.At, Actor: e.Actor, ActorTokenID: e.ActorTokenID,
			ActorRole: e.ActorRole, Action: e.Action, Target: e.Target, Result: e.Result,
			CorrelationID: e.CorrelationID, Detail: e.Detail})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
