package agent

import (
	"context"
	"errors"

	"github.com/drover-dev/drover/internal/node/osuser"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// AllocHandlers are allocation.provision_user and
// allocation.deprovision_user, run by internal/node/osuser with its state file
// in cfg.StateDir. On an OS osuser does not support (anything but Linux)
// both fail with code "not_supported". A failure is a *HandlerError with
// the osuser code; the outcome still carries the output and timings.
func AllocHandlers(cfg Config) Handlers {
	m, err := osuser.New(osuser.Options{StateDir: cfg.StateDir})
	return allocHandlers(m, err)
}

func allocHandlers(m *osuser.Manager, newErr error) Handlers {
	unsupported := func() error { return &HandlerError{api.CodedError{Code: "not_supported", Message: newErr.Error()}} }
	return Handlers{
		task.TypeAllocProvisionUser: {Timeout: task.AllocProvisionUserTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			p, fe := task.DecodeAllocProvisionUserParams(t.Params)
			if fe != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
			}
			if newErr != nil {
				return Outcome{}, unsupported()
			}
			out, timings, err := m.Provision(ctx, osuser.ProvisionRequest{AllocationID: p.AllocationID, Username: p.Username,
				SSHAuthorizedKeys: p.SSHAuthorizedKeys, Shell: p.Shell, Sudo: p.Sudo}, t.Progress)
			return Outcome{Output: out, Timings: timings}, allocHandlerError(ctx, err)
		}},
		task.TypeAllocDeprovisionUser: {Timeout: task.AllocDeprovisionUserTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			p, fe := task.DecodeAllocDeprovisionUserParams(t.Params)
			if fe != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
			}
			if newErr != nil {
				return Outcome{}, unsupported()
			}
			out, timings, err := m.Deprovision(ctx, osuser.DeprovisionRequest{AllocationID: p.AllocationID, Username: p.Username,
				RemoveHome: *p.RemoveHome}, t.Progress)
			return Outcome{Output: out, Timings: timings}, allocHandlerError(ctx, err)
		}},
	}
}

// allocHandlerError maps an *osuser.Error to a *HandlerError; when the
// task's context ended, err is left as is (the task loop reports a timeout).
func allocHandlerError(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	var e *osuser.Error
	if !errors.As(err, &e) {
		return &HandlerError{api.CodedError{Code: "osuser_failed", Message: err.Error(), Err: err}}
	}
	msg := "phase " + e.Phase + ": " + e.Message
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return &HandlerError{api.CodedError{Code: e.Code, Phase: e.Phase, Message: msg, Fields: e.Fields, Err: err}}
}
