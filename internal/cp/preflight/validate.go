package preflight

import (
	"encoding/json"
	"fmt"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// Bounds on a stored report.
const (
	maxHops       = 64
	maxDetail     = 4096
	maxText       = 1024
	maxInputs     = 32
	maxHopData    = 16 << 10
	maxReportSize = 256 << 10
)

// Validate checks a report before it is stored: its schema version, known
// hop and signal names and outcomes, and bounded sizes. Each error names
// its JSON field.
func Validate(r preflight.Report) []api.FieldError {
	var fe []api.FieldError
	add := func(field, format string, args ...any) {
		fe = append(fe, api.FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if r.Schema != preflight.SchemaVersion {
		add("schema", "must be %q", preflight.SchemaVersion)
	}
	if r.CorrelationID != "" && !httpapi.ValidCorrelationID(r.CorrelationID) {
		add("correlation_id", "must be 1-128 characters of [A-Za-z0-9._:-]")
	}
	if r.NodeID != "" {
		if err := api.ValidHostID(r.NodeID); err != nil {
			add("node_id", "%v", err)
		}
	}
	for field, v := range map[string]string{"allocation_id": r.AllocationID, "session_id": r.SessionID} {
		if len(v) > 128 {
			add(field, "must be at most 128 characters")
		}
	}
	if len(r.Inputs) > maxInputs {
		add("inputs", "at most %d entries", maxInputs)
	}
	for k, v := range r.Inputs {
		if len(k) > 64 || len(v) > maxText {
			add("inputs."+k, "keys at most 64 and values at most %d characters", maxText)
		}
	}
	switch {
	case len(r.Hops) == 0:
		add("hops", "at least one hop")
	case len(r.Hops) > maxHops:
		add("hops", "at most %d hops", maxHops)
	}
	known := make(map[signal.Hop]bool)
	for _, h := range signal.Hops() {
		known[h.Hop] = true
	}
	for i, h := range r.Hops {
		p := fmt.Sprintf("hops[%d]", i)
		if !known[h.Hop] {
			add(p+".hop", "unknown hop %q", h.Hop)
		}
		switch h.Status {
		case preflight.Passed, preflight.Failed, preflight.Skipped:
		default:
			add(p+".status", "must be passed, failed or skipped")
		}
		if h.Signal != "" {
			if _, ok := signal.Lookup(h.Signal); !ok {
				add(p+".signal", "unknown signal %q", h.Signal)
			}
		} else if h.Status == preflight.Failed {
			add(p+".signal", "a failed hop names its signal")
		}
		if len(h.Detail) > maxDetail {
			add(p+".detail", "at most %d characters", maxDetail)
		}
		if len(h.Owner) > maxText || len(h.Recovery) > maxText {
			add(p+".owner", "owner and recovery at most %d characters", maxText)
		}
		if h.Data != nil {
			if b, err := json.Marshal(h.Data); err != nil || len(b) > maxHopData {
				add(p+".data", "at most %d bytes of JSON", maxHopData)
			}
		}
	}
	c := r.Classification
	if c.Hop != "" && !known[c.Hop] {
		add("classification.failed_hop", "unknown hop %q", c.Hop)
	}
	if c.Signal != "" {
		if _, ok := signal.Lookup(c.Signal); !ok {
			add("classification.signal", "unknown signal %q", c.Signal)
		}
	}
	failed := false
	for _, h := range r.Hops {
		failed = failed || h.Status == preflight.Failed
	}
	if c.OK && (c.Hop != "" || c.Signal != "" || failed) {
		add("classification.ok", "an ok run has no failed hop and names no failed hop or signal")
	}
	if len(fe) == 0 {
		if b, _ := json.Marshal(r); len(b) > maxReportSize {
			add("hops", "the report must be at most %d bytes", maxReportSize)
		}
	}
	return fe
}
