// Package preflight owns the preflight report: the JSON document that
// `drover preflight` prints and stores, and that `drover-agent preflight`
// answers for the hops that run on the node. Hop and signal names come from
// internal/wire/signal. The schema is versioned (SchemaVersion); a change
// that renames or removes a field bumps it.
package preflight

import (
	"time"

	"github.com/drover-dev/drover/internal/wire/signal"
)

// SchemaVersion is the report schema's version ("schema" in the JSON).
const SchemaVersion = "drover.preflight/v1"

// Status is a hop's outcome.
type Status string

// Hop outcomes.
const (
	Passed  Status = "passed"
	Failed  Status = "failed"
	Skipped Status = "skipped" // not asked for (no allocation, no --run-ws-smoke), or after a failure
)

// HopResult is one hop's outcome.
type HopResult struct {
	Hop        signal.Hop `json:"hop"`
	Status     Status     `json:"status"`
	DurationMS int64      `json:"duration_ms"`
	// Detail says what was checked and seen, e.g. "TLS to 10.0.0.5:8443
	// (drover.example): certificate signed by unknown authority".
	Detail string `json:"detail,omitempty"`
	// Signal, Owner and Recovery are set when Status is failed.
	Signal   signal.Name `json:"signal,omitempty"`
	Owner    string      `json:"owner,omitempty"`
	Recovery string      `json:"recovery,omitempty"`
	// Data carries the hop's measurements (filesystem usage, task id,
	// session id, addresses) for the evidence bundle.
	Data map[string]any `json:"data,omitempty"`
}

// Fail fills the failure fields of r from the signal table.
func (r *HopResult) Fail(n signal.Name, detail string) {
	r.Status, r.Signal, r.Detail = Failed, n, detail
	if s, ok := signal.Lookup(n); ok {
		r.Owner, r.Recovery = s.Owner, s.Recovery
	}
}

// Classification is the final verdict: the first failed hop, its signal and
// owner; empty fields when every hop passed.
type Classification struct {
	OK       bool        `json:"ok"`
	Hop      signal.Hop  `json:"failed_hop,omitempty"`
	Signal   signal.Name `json:"signal,omitempty"`
	Owner    string      `json:"owner,omitempty"`
	Recovery string      `json:"recovery,omitempty"`
}

// Report is a whole preflight run.
type Report struct {
	Schema        string    `json:"schema"`
	CorrelationID string    `json:"correlation_id"`
	StartedAt     time.Time `json:"started_at"`
	FinishedAt    time.Time `json:"finished_at"`
	NodeID        string    `json:"node_id,omitempty"`
	AllocationID  string    `json:"allocation_id,omitempty"`
	SessionID     string    `json:"session_id,omitempty"`
	// Inputs are the flags the run was started with (URLs, resolve
	// addresses), never credentials.
	Inputs         map[string]string `json:"inputs,omitempty"`
	Hops           []HopResult       `json:"hops"`
	Classification Classification    `json:"classification"`
}

// Classify sets r.Classification from the first failed hop.
func (r *Report) Classify() {
	r.Classification = Classification{OK: true}
	for _, h := range r.Hops {
		if h.Status == Failed {
			r.Classification = Classification{Hop: h.Hop, Signal: h.Signal, Owner: h.Owner, Recovery: h.Recovery}
			return
		}
	}
}

// NodeReport is what `drover-agent preflight --json` prints: the hops that
// run on the node, with the agent's identity and build.
type NodeReport struct {
	Schema       string      `json:"schema"`
	NodeID       string      `json:"node_id,omitempty"`
	AgentVersion string      `json:"agent_version"`
	GOOS         string      `json:"goos"`
	GOARCH       string      `json:"goarch"`
	Hops         []HopResult `json:"hops"`
}
