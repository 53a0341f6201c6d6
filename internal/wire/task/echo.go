package task

import (
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

const (
	// TypeEcho echoes a message back from the node: the smallest task that
	// proves the task path end to end (enqueue, claim, signed envelope,
	// handler, result).
	TypeEcho = "diag.echo"
	// EchoTimeout bounds diag.echo on the agent.
	EchoTimeout = 10 * time.Second
	// MaxEchoMessage bounds diag.echo's message, in bytes.
	MaxEchoMessage = 1024
)

// EchoParams are the params of diag.echo.
type EchoParams struct {
	// Message is echoed back: at most MaxEchoMessage bytes (of UTF-8);
	// "" is allowed.
	Message string `json:"message"`
}

// EchoOutput is diag.echo's output.
type EchoOutput struct {
	// Message is the params' message.
	Message string `json:"message"`
	// NodeID is the id of the node that ran the task.
	NodeID string `json:"node_id"`
	// RanAt is when the handler ran, by the node's clock (UTC).
	RanAt time.Time `json:"ran_at"`
}

// EchoSpec is diag.echo's registry entry.
func EchoSpec() Spec {
	return Spec{Type: TypeEcho, Validate: validateEcho, Timeout: EchoTimeout,
		Meaning: "echo a message back from the node: proves the task path end to end", Params: EchoParams{}}
}

// DecodeEchoParams strictly decodes and validates diag.echo's params; the
// server and the agent both use it.
func DecodeEchoParams(params json.RawMessage) (EchoParams, []api.FieldError) {
	var p EchoParams
	if fe := DecodeParams(params, &p); fe != nil {
		return EchoParams{}, fe
	}
	if len(p.Message) > MaxEchoMessage {
		return EchoParams{}, []api.FieldError{{Field: "params.message", Message: "must be at most 1024 bytes"}}
	}
	return p, nil
}

func validateEcho(params json.RawMessage) []api.FieldError {
	_, fe := DecodeEchoParams(params)
	return fe
}
