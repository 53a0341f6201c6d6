package store

import (
	"context"
	"encoding/json"
	"time"
)

// PreflightRun is one stored preflight report (internal/wire/preflight
// Report, kept whole in Report) with the fields it is found by.
type PreflightRun struct {
	ID            string
	HostID        string
	CorrelationID string
	OK            bool
	FailedHop     string // the classification's hop; "" when OK
	Signal        string // the classification's signal; "" when OK
	Report        json.RawMessage
	CreatedBy     string
	CreatedAt     time.Time
}

// PreflightFilter narrows ListPreflightRuns. Zero fields do not filter.
type PreflightFilter struct {
	HostID        string
	CorrelationID string
	Limit         int // default 100
}

// PreflightStore is the stored preflight runs: the preflight room
// (cp/preflight) embeds it whole; the evidence bundle reads them by
// correlation id.
type PreflightStore interface {
	// CreatePreflightRun inserts a run; ErrConflict if the id exists.
	CreatePreflightRun(ctx context.Context, r PreflightRun) error
	// GetPreflightRun returns a run or ErrNotFound.
	GetPreflightRun(ctx context.Context, id string) (PreflightRun, error)
	// ListPreflightRuns returns runs newest first.
	ListPreflightRuns(ctx context.Context, f PreflightFilter) ([]PreflightRun, error)
}
