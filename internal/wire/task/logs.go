package task

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Logs task type: the control plane creates it for `GET
// /api/v1/instances/{id}/logs`; operators cannot enqueue it
// (Spec.Internal).
const (
	// TypeLogsOpen asks a node to read instance InstanceID's logs from its
	// runtime and send them on the control plane's node-facing logs stream
	// for SessionID (nodeapi.LogsStream, internal/wire/logstream),
	// presenting Nonce. The agent reports success once the stream is
	// connected and the log opened; the stream then outlives the task.
	TypeLogsOpen = "logs.open"
	// LogsOpenTimeout bounds logs.open on the agent: the instance check,
	// the log open and the dial, not the stream.
	LogsOpenTimeout = 30 * time.Second
	// MaxLogsTail bounds tail.
	MaxLogsTail = 100000
)

// LogsOpenParams are the params of logs.open.
type LogsOpenParams struct {
	SessionID  string `json:"session_id"`
	InstanceID string `json:"instance_id"`
	// Nonce is the per-session secret the node presents on the stream
	// (header X-Drover-Logs-Nonce); single use.
	Nonce  string `json:"nonce"`
	Follow bool   `json:"follow,omitempty"`
	// Since keeps only lines written at or after it (absent: all).
	Since *time.Time `json:"since,omitempty"`
	// Tail keeps only the last Tail past lines (0: all).
	Tail int `json:"tail,omitempty"`
	// MaxLifetime ends the stream on the node even if the control plane is
	// gone: a follow stream's lifetime, or a bound on reading a whole log.
	MaxLifetime api.Duration `json:"max_lifetime"`
	// StreamURL is the node-facing base URL of the replica holding the
	// stream, which the agent dials instead of its configured URL ("": the
	// configured one); see checkStreamURL.
	StreamURL string `json:"stream_url,omitempty"`
}

// DecodeLogsOpenParams strictly decodes and validates the params of
// logs.open; the server and the agent both use it.
func DecodeLogsOpenParams(params json.RawMessage) (LogsOpenParams, []api.FieldError) {
	var p LogsOpenParams
	if fe := DecodeParams(params, &p); fe != nil {
		return LogsOpenParams{}, fe
	}
	var v fieldErrs
	v.check("session_id", checkRequired(p.SessionID, checkToken))
	v.check("instance_id", checkVMName(p.InstanceID))
	v.check("nonce", checkRequired(p.Nonce, checkToken))
	if p.Tail < 0 || p.Tail > MaxLogsTail {
		v.add("tail", fmt.Sprintf("must be 0-%d", MaxLogsTail))
	}
	if p.MaxLifetime <= 0 {
		v.add("max_lifetime", "must be positive")
	}
	v.check("stream_url", checkStreamURL(p.StreamURL))
	if v.fe != nil {
		return LogsOpenParams{}, v.fe
	}
	return p, nil
}

func validateLogsOpen(params json.RawMessage) []api.FieldError {
	_, fe := DecodeLogsOpenParams(params)
	return fe
}
