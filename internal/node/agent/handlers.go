package agent

import (
	"context"
	"encoding/json"
	"time"
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

// HandlerError is a handler failure with a stable code for the result.
type HandlerError struct {
	Code    string
	Message string
}

func (e *HandlerError) Error() string { return e.Code + ": " + e.Message }
