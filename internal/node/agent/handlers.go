package agent

import (
	"context"
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Task is what a handler receives: verified claims only.
type Task struct {
	ID            string
	Type          string
	CorrelationID string
	Params        json.RawMessage
	// Progress reports a finished phase; it is streamed to the control
	// plane as a task event.
	Progress func(phase string, d time.Duration, err error)
}

// Outcome is what a handler returns. Timings keys are "<phase>_ms".
type Outcome struct {
	Output  any
	Timings map[string]int64
}

// Handler is one registered task type. Run is bounded by Timeout.
type Handler struct {
	Timeout time.Duration
	Run     func(ctx context.Context, t Task) (Outcome, error)
}

// Handlers maps task types to handlers. Only these ever run.
type Handlers map[string]Handler

// HandlerError is a handler failure with a stable code for the result: an
// api.CodedError (its own type, so the task loop's errors.As tells it from
// the errors it wraps). The result's error carries its Code, Message and
// Fields; Phase and Err stay on the node (Err keeps errors.Is and errors.As
// reaching the cause).
type HandlerError struct {
	api.CodedError
}

// Error is "code: message" (the result's code and message; no phase or
// cause).
func (e *HandlerError) Error() string { return e.Code + ": " + e.Message }
