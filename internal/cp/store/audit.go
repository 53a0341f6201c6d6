package store

import (
	"context"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// AuditEvent is one append-only audit record.
type AuditEvent struct {
	ID            int64
	At            time.Time
	Actor         string
	ActorTokenID  string   // the operator token behind Actor, if any
	ActorRole     api.Role // that token's role when it acted
	Action        string
	Target        string
	Result        string
	CorrelationID string
	Detail        string
}

// AuditFilter narrows ListAudit. Zero fields do not filter.
type AuditFilter struct {
	Actor         string
	Role          api.Role // ActorRole
	Action        string
	Target        string
	CorrelationID string
	Since, Until  time.Time // At >= Since, At < Until
	Limit         int       // default 100
}

// AuditStore is the append-only audit log: the audit room (cp/audit, whose
// Log every other room records through) embeds it whole.
type AuditStore interface {
	// AppendAudit appends an audit record.
	AppendAudit(ctx context.Context, e AuditEvent) error
	// AppendAudits appends records in one write, in their order.
	AppendAudits(ctx context.Context, es []AuditEvent) error
	// ListAudit returns audit records newest first.
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, error)
}
