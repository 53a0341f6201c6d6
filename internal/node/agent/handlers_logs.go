package agent

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/drover-dev/drover/internal/node/lognode"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// LogsHandlers is logs.open, run by m: it succeeds once the instance's log
// is open and the stream to the control plane connected; the stream then
// outlives the task. A failure is a *HandlerError with the lognode code
// (logs_instance_unknown, logs_unsupported, logs_read_failed,
// logs_node_stream_limit, logs_node_stream_timeout,
// logs_node_stream_mtls_failed, logs_session_rejected, invalid_params,
// agent_shutdown).
func LogsHandlers(m *lognode.Manager) Handlers {
	return Handlers{
		task.TypeLogsOpen: {Timeout: task.LogsOpenTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			p, fe := task.DecodeLogsOpenParams(t.Params)
			if fe != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
			}
			res, err := m.Open(ctx, p, t.CorrelationID)
			out := Outcome{Output: res, Timings: map[string]int64{"stream_connect_ms": res.StreamConnectMS}}
			if err != nil {
				var e *lognode.Error
				if errors.As(err, &e) {
					msg := e.Message
					if e.Err != nil {
						msg += ": " + e.Err.Error()
					}
					return out, &HandlerError{api.CodedError{Code: e.Code, Message: msg, Err: err}}
				}
				return out, &HandlerError{api.CodedError{Code: lognode.CodeReadFailed, Message: err.Error(), Err: err}}
			}
			return out, nil
		}},
	}
}

// newLogsManager builds the log stream manager: streams go to the same
// node-facing URL as terminals, with the node's mTLS identity; logs come
// from the instance runtime.
func (a *Agent) newLogsManager() *lognode.Manager {
	return lognode.New(lognode.Config{
		NodeID:    a.nodeID,
		BaseURL:   a.cfg.terminalURL(),
		TLSConfig: a.nodeTLSConfig,
		Source:    a.instanceLogs,
		Logger:    a.log.With("component", "logs"),
	})
}

// instanceLogs opens the log of an instance this agent's runtime runs. The
// id is checked against the runtime's own state (Inspect); where the log
// lives is the runtime's business, never the caller's.
func (a *Agent) instanceLogs(ctx context.Context, instanceID string, opts runtime.LogOptions) (io.ReadCloser, error) {
	if !runtime.ValidID(instanceID) {
		return nil, fmt.Errorf("instance id %q: %w", instanceID, runtime.ErrNotFound)
	}
	a.mu.Lock()
	vms := a.vms
	a.mu.Unlock()
	if vms == nil {
		return nil, fmt.Errorf("this host runs no instances: %w", lognode.ErrUnsupported)
	}
	if _, err := vms.rt.Inspect(ctx, instanceID); err != nil {
		return nil, fmt.Errorf("inspect instance %q: %w", instanceID, err)
	}
	lr, ok := vms.rt.(runtime.LogReader)
	if !ok {
		return nil, fmt.Errorf("runtime %s: %w", vms.rt.Name(), lognode.ErrUnsupported)
	}
	return lr.Logs(ctx, instanceID, opts)
}
