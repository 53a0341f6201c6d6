package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"

	"github.com/drover-dev/drover/internal/node/osuser"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestCodedErrors: every node error type that embeds api.CodedError gives
// its code to api.ErrorCode (also when wrapped), keeps its own Error()
// text, and stays its own type for errors.As (none is an *api.CodedError,
// none is another's).
func TestCodedErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code string
		text string
		is   string // the one type errors.As finds
	}{
		{"osuser", &osuser.Error{CodedError: api.CodedError{Code: osuser.CodeUserExistsUnmanaged, Phase: "useradd",
			Message: "user alice exists", Err: io.EOF}},
			"user_exists_unmanaged", "osuser: useradd: user_exists_unmanaged: user alice exists: EOF", "osuser"},
		{"termnode", &termnode.Error{CodedError: api.CodedError{Code: termnode.CodePTYFailed, Message: "open pty", Err: io.EOF}},
			termnode.CodePTYFailed, termnode.CodePTYFailed + ": open pty: EOF", "termnode"},
		{"slicevm", &slicevm.Error{CodedError: api.CodedError{Code: slicevm.CodeMissingDependency, Phase: "host_check",
			Message: "qemu-img not found", Err: io.EOF}, Blocker: "command_missing:qemu-img"},
			slicevm.CodeMissingDependency, "slicevm: host_check: " + slicevm.CodeMissingDependency +
				": qemu-img not found (blocker command_missing:qemu-img)", "slicevm"},
		{"slicevm without blocker", &slicevm.Error{CodedError: api.CodedError{Code: "invalid_params", Phase: "params", Message: "bad"}},
			"invalid_params", "slicevm: params: invalid_params: bad", "slicevm"},
		{"handler", &HandlerError{api.CodedError{Code: "invalid_params", Phase: "params", Message: "invalid params: x: bad", Err: io.EOF}},
			"invalid_params", "invalid_params: invalid params: x: bad", "handler"},
		{"uncoded", errors.New("plain"), "", "plain", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.text {
				t.Errorf("Error() = %q, want %q", got, tc.text)
			}
			wrapped := fmt.Errorf("outer: %w", tc.err)
			if got := api.ErrorCode(wrapped); got != tc.code {
				t.Errorf("api.ErrorCode = %q, want %q", got, tc.code)
			}
			var (
				ou *osuser.Error
				tn *termnode.Error
				sv *slicevm.Error
				he *HandlerError
				ce *api.CodedError
			)
			found := map[string]bool{
				"osuser":   errors.As(wrapped, &ou),
				"termnode": errors.As(wrapped, &tn),
				"slicevm":  errors.As(wrapped, &sv),
				"handler":  errors.As(wrapped, &he),
				"coded":    errors.As(wrapped, &ce),
			}
			for typ, ok := range found {
				if ok != (typ == tc.is) {
					t.Errorf("errors.As(*%s) = %v", typ, ok)
				}
			}
			var cause error
			if u, ok := tc.err.(interface{ Unwrap() error }); ok {
				cause = u.Unwrap()
			}
			if (cause == io.EOF) != errors.Is(wrapped, io.EOF) {
				t.Errorf("errors.Is(EOF) = %v with cause %v", errors.Is(wrapped, io.EOF), cause)
			}
		})
	}
}

// TestVMHandlerErrorCarriesFields: a slicevm error's code, phase and fields
// reach the HandlerError (and so the task result); the message keeps its
// form and the slicevm error stays reachable.
func TestVMHandlerErrorCarriesFields(t *testing.T) {
	fe := []api.FieldError{{Field: "params.slots[0].pci_address", Message: "0000:19:00.0 is not a device of an approved slot on this host"}}
	src := &slicevm.Error{CodedError: api.CodedError{Code: slicevm.CodeDeviceNotAllowed, Phase: slicevm.PhaseDeviceCheck,
		Message: fe[0].Field + ": " + fe[0].Message, Fields: fe, Err: slicevm.ErrDeviceNotAllowed}}
	err := vmHandlerError(context.Background(), fmt.Errorf("provision: %w", src))
	var he *HandlerError
	if !errors.As(err, &he) {
		t.Fatalf("err = %T %v, want a *HandlerError", err, err)
	}
	wantText := slicevm.CodeDeviceNotAllowed + ": phase device_check: " + fe[0].Field + ": " + fe[0].Message
	if he.Error() != wantText || he.Code != slicevm.CodeDeviceNotAllowed || he.Phase != slicevm.PhaseDeviceCheck {
		t.Errorf("HandlerError = %q (code %q, phase %q), want %q", he.Error(), he.Code, he.Phase, wantText)
	}
	if !reflect.DeepEqual(he.Fields, fe) {
		t.Errorf("Fields = %+v, want %+v", he.Fields, fe)
	}
	var sv *slicevm.Error
	if !errors.Is(err, slicevm.ErrDeviceNotAllowed) || !errors.As(err, &sv) || sv != src {
		t.Errorf("the slicevm error is not reachable from %v", err)
	}
	if api.ErrorCode(err) != slicevm.CodeDeviceNotAllowed {
		t.Errorf("api.ErrorCode = %q", api.ErrorCode(err))
	}

	blocked := &slicevm.Error{CodedError: api.CodedError{Code: slicevm.CodeMissingDependency, Phase: "host_check", Message: "qemu-img not found"},
		Blocker: "command_missing:qemu-img"}
	if err := vmHandlerError(context.Background(), blocked); err.Error() != slicevm.CodeMissingDependency+
		": phase host_check: qemu-img not found (blocker: command_missing:qemu-img)" || api.ErrorCode(err) != slicevm.CodeMissingDependency {
		t.Errorf("blocked = %q", err)
	}
}
