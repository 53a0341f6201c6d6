// Package audit is the control plane's audit log: every room records what
// it did (Event for a store write's own transaction, Record after it,
// Require before an action that must not happen unrecorded), and
// operators read it (GET /api/v1/audit, List).
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
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
	err := l.st.AppendAudit(context.WithoutCancel(ctx), l.Event(ctx, e))
	if err != nil {
		l.log.Error("append audit", "err", err, "action", e.Action, "target", e.Target, "correlation_id", e.CID)
	}
}

// Require appends e and returns the failure, for an action that must not
// happen unrecorded: the caller refuses it when its record cannot be
// stored (a secret's delivery), as Vault refuses a request no audit
// device could log.
func (l *Log) Require(ctx context.Context, e Entry) error {
	if err := l.st.AppendAudit(context.WithoutCancel(ctx), l.Event(ctx, e)); err != nil {
		l.log.Error("append audit: the action is refused", "err", err, "action", e.Action, "target", e.Target, "correlation_id", e.CID)
		return fmt.Errorf("audit %s of %s: %w", e.Action, e.Target, err)
	}
	return nil
}

// Event is e as Record would store it, stamped now: for a store write
// that appends the record in the transaction of the change it describes
// (ADR 0016).
func (l *Log) Event(ctx context.Context, e Entry) store.AuditEvent {
	ev := store.AuditEvent{
		At: l.now().UTC(), Actor: e.Actor, Action: e.Action, Target: e.Target,
		Result: e.Result, CorrelationID: e.CID, Detail: e.Detail,
	}
	if p, ok := httpapi.PrincipalFrom(ctx); ok && e.Actor == p.Actor() {
		ev.ActorTokenID, ev.ActorRole = p.TokenID, p.Role
	}
	return ev
}

// maxExport bounds one JSON lines export.
const maxExport = 10000

// FilterOf parses GET /api/v1/audit's query: actor, role, action, target,
// correlation_id, since and until (RFC 3339; since inclusive, until
// exclusive) and limit.
func FilterOf(q url.Values) (store.AuditFilter, error) {
	f := store.AuditFilter{Actor: q.Get("actor"), Role: api.Role(q.Get("role")), Action: q.Get("action"),
		Target: q.Get("target"), CorrelationID: q.Get("correlation_id")}
	f.Limit, _ = strconv.Atoi(q.Get("limit"))
	var fields []api.FieldError
	if f.Role != "" && !slices.Contains(api.Roles, f.Role) {
		fields = append(fields, api.FieldError{Field: "role", Message: "unknown role"})
	}
	for _, t := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(t.name); v != "" {
			tm, err := time.Parse(time.RFC3339, v)
			if err != nil {
				fields = append(fields, api.FieldError{Field: t.name, Message: "must be an RFC 3339 time such as 2024-01-02T15:04:05Z"})
			}
			*t.dst = tm
		}
	}
	if f := q.Get("format"); f != "" && f != "json" && f != "jsonl" {
		fields = append(fields, api.FieldError{Field: "format", Message: "json or jsonl"})
	}
	if len(fields) > 0 {
		return f, httpapi.Invalid(fields)
	}
	return f, nil
}

// View is an audit record's API form.
func View(e store.AuditEvent) api.AuditEvent {
	return api.AuditEvent{ID: e.ID, At: e.At, Actor: e.Actor, ActorTokenID: e.ActorTokenID,
		ActorRole: e.ActorRole, Action: e.Action, Target: e.Target, Result: e.Result,
		CorrelationID: e.CorrelationID, Detail: e.Detail}
}

// List is GET /api/v1/audit: the newest entries, filtered (FilterOf). With
// ?format=jsonl it is a download of JSON lines (application/x-ndjson, one
// record a line, newest first; limit defaults to and is capped at 10000).
func (l *Log) List(w http.ResponseWriter, r *http.Request) error {
	f, err := FilterOf(r.URL.Query())
	if err != nil {
		return err
	}
	jsonl := r.URL.Query().Get("format") == "jsonl"
	if jsonl && (f.Limit <= 0 || f.Limit > maxExport) {
		f.Limit = maxExport
	}
	evs, err := l.st.ListAudit(r.Context(), f)
	if err != nil {
		return err
	}
	if jsonl {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Content-Disposition", `attachment; filename="audit.jsonl"`)
		w.WriteHeader(http.StatusOK)
		enc := json.NewEncoder(w)
		for _, e := range evs {
			if err := enc.Encode(View(e)); err != nil {
				return nil // the client went
			}
		}
		return nil
	}
	out := make([]api.AuditEvent, 0, len(evs))
	for _, e := range evs {
		out = append(out, View(e))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
