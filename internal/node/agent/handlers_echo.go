package agent

import (
	"context"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// EchoHandler runs diag.echo: it returns the message with nodeID and the
// time it ran (now, in UTC). It touches nothing on the host; preflight uses
// it to prove the task path end to end.
func EchoHandler(nodeID string, now func() time.Time) Handler {
	return Handler{Timeout: task.EchoTimeout, Run: func(_ context.Context, t Task) (Outcome, error) {
		p, fe := task.DecodeEchoParams(t.Params)
		if fe != nil {
			return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
		}
		return Outcome{Output: task.EchoOutput{Message: p.Message, NodeID: nodeID, RanAt: now().UTC()}}, nil
	}}
}
