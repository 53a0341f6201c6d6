package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TerminalHandlers is terminal.open, run by m: it succeeds once the stream
// to the gateway is connected and the PTY started (or the serial console
// attached); the session then outlives the task. A failure is a
// *HandlerError with the termnode code (terminal_pty_failed,
// terminal_node_stream_mtls_failed, node_stream_timeout,
// terminal_session_rejected, invalid_params, agent_shutdown; in mode vm_ssh
// also guest_not_owned, guest_terminal_unavailable, guest_ssh_unreachable,
// guest_host_key_mismatch, guest_auth_failed).
func TerminalHandlers(m *termnode.Manager) Handlers {
	return Handlers{
		task.TypeTerminalOpen: {Timeout: task.TerminalOpenTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			p, fe := task.DecodeTerminalOpenParams(t.Params)
			if fe != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
			}
			res, err := m.Open(ctx, p, t.CorrelationID, t.Progress)
			timings := map[string]int64{"stream_connect_ms": res.StreamConnectMS}
			switch {
			case err == nil && p.Mode == task.TerminalModeSerial, res.SerialAttachMS > 0:
				timings["serial_attach_ms"] = res.SerialAttachMS
			case err == nil, res.PTYStartMS > 0:
				timings["pty_start_ms"] = res.PTYStartMS
			}
			out := Outcome{Output: res, Timings: timings}
			if err != nil {
				return out, terminalHandlerError(err)
			}
			return out, nil
		}},
	}
}

// terminalHandlerError maps a *termnode.Error to a *HandlerError.
func terminalHandlerError(err error) error {
	var e *termnode.Error
	if !errors.As(err, &e) {
		return &HandlerError{api.CodedError{Code: termnode.CodePTYFailed, Message: err.Error(), Err: err}}
	}
	msg := e.Message
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return &HandlerError{api.CodedError{Code: e.Code, Phase: e.Phase, Message: msg, Fields: e.Fields, Err: err}}
}

// newTerminalManager builds the terminal session manager: streams go to
// NODE_AGENT_TERMINAL_URL with the node's mTLS identity, serial consoles
// come from the instance runtime, slice VMs' SSH targets from the slice
// provisioner's records.
func (a *Agent) newTerminalManager() *termnode.Manager {
	return termnode.New(termnode.Config{
		NodeID:       a.nodeID,
		BaseURL:      a.cfg.terminalURL(),
		TLSConfig:    a.nodeTLSConfig,
		SerialSocket: a.serialSocket,
		VMTarget:     a.vmTerminalTarget,
		Logger:       a.log.With("component", "terminal"),
	})
}

// nodeTLSConfig is the mTLS client configuration of the node identity, or
// nil before the agent has one.
func (a *Agent) nodeTLSConfig() *tls.Config {
	if a.node == nil {
		return nil
	}
	return a.node.tlsConfig()
}

// serialSocket finds the serial console socket of a running instance.
func (a *Agent) serialSocket(ctx context.Context, instanceID string) (string, error) {
	a.mu.Lock()
	vms := a.vms
	a.mu.Unlock()
	if vms == nil {
		return "", errors.New("this host runs no instances")
	}
	st, err := vms.rt.Inspect(ctx, instanceID)
	if errors.Is(err, runtime.ErrNotFound) {
		return "", fmt.Errorf("instance %q does not run on this node", instanceID)
	} else if err != nil {
		return "", fmt.Errorf("inspect instance %q: %w", instanceID, err)
	}
	if st.State != runtime.StateRunning {
		return "", fmt.Errorf("instance %q is %s, not running", instanceID, st.State)
	}
	if st.SerialSocket == "" {
		return "", fmt.Errorf("instance %q has no serial console socket in this runtime", instanceID)
	}
	return st.SerialSocket, nil
}

// vmTerminalTarget is slice VM vm's brokered-terminal target for a session
// of allocationID, from the slice provisioner's own record; a VM another
// allocation owns is refused with guest_not_owned.
func (a *Agent) vmTerminalTarget(_ context.Context, vm, allocationID string) (termnode.VMTarget, error) {
	a.mu.Lock()
	vms := a.vms
	a.mu.Unlock()
	if vms == nil || vms.slices == nil {
		return termnode.VMTarget{}, &termnode.Error{CodedError: api.CodedError{Code: termnode.CodeGuestTerminalUnavailable,
			Message: "this host runs no slice VMs"}}
	}
	t, err := vms.slices.GuestTarget(vm, allocationID)
	if errors.Is(err, slicevm.ErrNotOwned) {
		return termnode.VMTarget{}, &termnode.Error{CodedError: api.CodedError{Code: termnode.CodeGuestNotOwned,
			Message: "refused", Err: err}}
	} else if err != nil {
		return termnode.VMTarget{}, &termnode.Error{CodedError: api.CodedError{Code: termnode.CodeGuestTerminalUnavailable,
			Message: "no brokered terminal", Err: err}}
	}
	return t, nil
}
