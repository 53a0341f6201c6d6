package agent

import (
	"context"
	"errors"
	"strings"

	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// VMHandlers are slice.vm_provision and slice.vm_release, run by p. A
// failure is a *HandlerError whose code is the slicevm error code and whose
// message names the failed phase (and the host blocker, if any); the
// outcome still carries the output and timings, so the result shows the
// phases that ran and the cleanup steps.
func VMHandlers(p *slicevm.Provisioner) Handlers {
	return Handlers{
		task.TypeVMProvision: {Timeout: task.VMProvisionTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			params, fe := task.DecodeVMProvisionParams(t.Params)
			if fe != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
			}
			out, timings, err := p.Provision(ctx, params, t.Progress)
			return Outcome{Output: out, Timings: timings}, vmHandlerError(ctx, err)
		}},
		task.TypeVMRelease: {Timeout: task.VMReleaseTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			params, fe := task.DecodeVMReleaseParams(t.Params)
			if fe != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
			}
			out, timings, err := p.Release(ctx, params, t.Progress)
			return Outcome{Output: out, Timings: timings}, vmHandlerError(ctx, err)
		}},
	}
}

// vmHandlerError maps a *slicevm.Error to a *HandlerError with its code,
// phase and fields (the refused params of device_not_allowed, the image
// param of image_unsafe), which the task result carries; the slicevm error
// stays its cause. When the task's context ended, the error is left as is so
// that the task loop reports a timeout or shutdown.
func vmHandlerError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return err
	}
	var e *slicevm.Error
	if !errors.As(err, &e) {
		return &HandlerError{api.CodedError{Code: "slice_vm_failed", Message: err.Error(), Err: err}}
	}
	msg := "phase " + e.Phase + ": " + e.Message
	if e.Blocker != "" {
		msg += " (blocker: " + e.Blocker + ")"
	}
	return &HandlerError{api.CodedError{Code: e.Code, Phase: e.Phase, Message: msg, Fields: e.Fields, Err: err}}
}

func fieldErrorText(fe []api.FieldError) string {
	parts := make([]string, len(fe))
	for i, f := range fe {
		parts[i] = f.Field + ": " + f.Message
	}
	return "invalid params: " + strings.Join(parts, "; ")
}
