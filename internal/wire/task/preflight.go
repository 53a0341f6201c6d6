package task

import (
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

const (
	// TypePreflight runs the node-local preflight hops (node_readiness,
	// node_runtime_api_reachability, node_terminal_reachability: what
	// `drover-agent preflight` runs) and answers an
	// internal/wire/preflight Report, which the control plane stores as a
	// preflight run of the host.
	TypePreflight = "diag.preflight"
	// DefaultPreflightHopTimeout and MaxPreflightHopTimeout bound each hop
	// (seconds); PreflightTimeout bounds the whole task on the agent: three
	// hops at the longest hop timeout, with room to build the report.
	DefaultPreflightHopTimeout = 10
	MaxPreflightHopTimeout     = 20
	PreflightTimeout           = 3*MaxPreflightHopTimeout*time.Second + 10*time.Second
)

// PreflightParams are the params of diag.preflight.
type PreflightParams struct {
	// HopTimeoutSeconds bounds each hop (default 10, at most 20).
	HopTimeoutSeconds int `json:"hop_timeout_seconds,omitempty"`
}

// PreflightSpec is diag.preflight's registry entry.
func PreflightSpec() Spec {
	return Spec{Type: TypePreflight, Validate: validatePreflight, Timeout: PreflightTimeout,
		Meaning: "run the node-local preflight hops (what `drover-agent preflight` runs); the report is stored as the host's preflight run",
		Params:  PreflightParams{}}
}

// DecodePreflightParams strictly decodes diag.preflight's params and
// applies the default hop timeout.
func DecodePreflightParams(params json.RawMessage) (PreflightParams, []api.FieldError) {
	var p PreflightParams
	if fe := DecodeParams(params, &p); fe != nil {
		return PreflightParams{}, fe
	}
	switch {
	case p.HopTimeoutSeconds < 0 || p.HopTimeoutSeconds > MaxPreflightHopTimeout:
		return PreflightParams{}, []api.FieldError{{Field: "params.hop_timeout_seconds", Message: "must be between 0 (default 10) and 20"}}
	case p.HopTimeoutSeconds == 0:
		p.HopTimeoutSeconds = DefaultPreflightHopTimeout
	}
	return p, nil
}

func validatePreflight(params json.RawMessage) []api.FieldError {
	_, fe := DecodePreflightParams(params)
	return fe
}
