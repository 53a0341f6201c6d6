package task

import (
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

const (
	// TypeCollect gathers the agent's recent diagnostics for an evidence
	// bundle: its status, its recent diagnostic events and log lines.
	TypeCollect = "diag.collect"
	// CollectTimeout bounds diag.collect on the agent.
	CollectTimeout = 20 * time.Second
	// DefaultCollectBytes and MaxCollectBytes bound the output's size: a
	// task result must fit the control plane's 1 MiB request body limit.
	DefaultCollectBytes = 256 << 10
	MaxCollectBytes     = 768 << 10
)

// CollectParams are the params of diag.collect.
type CollectParams struct {
	// MaxBytes bounds the output's log lines and events together
	// (default DefaultCollectBytes, at most MaxCollectBytes); the newest
	// are kept.
	MaxBytes int `json:"max_bytes,omitempty"`
	// CorrelationID, when set, marks the lines and events carrying that
	// correlation id (they are kept first when the bound is hit).
	CorrelationID string `json:"correlation_id,omitempty"`
}

// DiagnosticEvent is one problem the agent saw and classified.
type DiagnosticEvent struct {
	At            time.Time `json:"at"`
	Signal        string    `json:"signal"` // an internal/wire/signal name
	Detail        string    `json:"detail,omitempty"`
	CorrelationID string    `json:"correlation_id,omitempty"`
	Cleared       bool      `json:"cleared,omitempty"` // the problem ended
}

// CollectOutput is diag.collect's output.
type CollectOutput struct {
	NodeID      string    `json:"node_id"`
	CollectedAt time.Time `json:"collected_at"`
	// Status is the agent's status document (what /healthz and
	// `drover-agent status` show).
	Status json.RawMessage `json:"status,omitempty"`
	// Events are the agent's recent diagnostic events, oldest first.
	Events []DiagnosticEvent `json:"events"`
	// Log holds the agent's recent log lines (JSON, one per line), oldest
	// first.
	Log []string `json:"log"`
	// Truncated is true when older lines or events were dropped to fit
	// MaxBytes.
	Truncated bool `json:"truncated"`
}

// CollectSpec is diag.collect's registry entry.
func CollectSpec() Spec {
	return Spec{Type: TypeCollect, Validate: validateCollect, Timeout: CollectTimeout,
		Meaning: "collect the agent's status, recent diagnostic events and log lines (bounded) for an evidence bundle",
		Params:  CollectParams{}}
}

// DecodeCollectParams strictly decodes diag.collect's params and applies
// the default bound.
func DecodeCollectParams(params json.RawMessage) (CollectParams, []api.FieldError) {
	var p CollectParams
	if fe := DecodeParams(params, &p); fe != nil {
		return CollectParams{}, fe
	}
	switch {
	case p.MaxBytes < 0 || p.MaxBytes > MaxCollectBytes:
		return CollectParams{}, []api.FieldError{{Field: "params.max_bytes", Message: "must be between 0 (default 262144) and 786432"}}
	case len(p.CorrelationID) > 128:
		return CollectParams{}, []api.FieldError{{Field: "params.correlation_id", Message: "must be at most 128 characters"}}
	case p.MaxBytes == 0:
		p.MaxBytes = DefaultCollectBytes
	}
	return p, nil
}

func validateCollect(params json.RawMessage) []api.FieldError {
	_, fe := DecodeCollectParams(params)
	return fe
}
