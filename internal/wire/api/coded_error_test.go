package api_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

type ownError struct {
	api.CodedError
	Extra string
}

func TestCodedError(t *testing.T) {
	tests := []struct {
		err  *api.CodedError
		want string
	}{
		{&api.CodedError{Code: "invalid_params", Message: "bad"}, "invalid_params: bad"},
		{&api.CodedError{Code: "pty_failed", Message: "open", Err: io.EOF}, "pty_failed: open: EOF"},
		{&api.CodedError{Code: "c", Phase: "p", Message: "m", Err: io.EOF}, "p: c: m: EOF"},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
	e := &api.CodedError{Code: "c", Err: io.EOF}
	wrapped := fmt.Errorf("outer: %w", e)
	if !errors.Is(wrapped, io.EOF) || api.ErrorCode(wrapped) != "c" {
		t.Errorf("wrapped: Is(EOF) %v, ErrorCode %q", errors.Is(wrapped, io.EOF), api.ErrorCode(wrapped))
	}
	own := fmt.Errorf("x: %w", &ownError{CodedError: api.CodedError{Code: "own", Err: io.ErrUnexpectedEOF}})
	if api.ErrorCode(own) != "own" || !errors.Is(own, io.ErrUnexpectedEOF) {
		t.Errorf("embedded: ErrorCode %q, Is %v", api.ErrorCode(own), errors.Is(own, io.ErrUnexpectedEOF))
	}
	if api.ErrorCode(io.EOF) != "" || api.ErrorCode(nil) != "" {
		t.Error("an uncoded error has a code")
	}
}

// TestResultErrorFields: a result error without fields encodes exactly as
// before Fields existed; one with fields carries them.
func TestResultErrorFields(t *testing.T) {
	tests := []struct {
		re   api.ResultError
		want string
	}{
		{api.ResultError{Code: "handler_failed", Message: "boom"}, `{"code":"handler_failed","message":"boom"}`},
		{api.ResultError{Code: "c", Message: "m", Fields: []api.FieldError{}}, `{"code":"c","message":"m"}`},
		{api.ResultError{Code: "device_not_allowed", Message: "m", Fields: []api.FieldError{{Field: "params.x", Message: "no"}}},
			`{"code":"device_not_allowed","message":"m","fields":[{"field":"params.x","message":"no"}]}`},
	}
	for _, tc := range tests {
		b, err := json.Marshal(tc.re)
		if err != nil || string(b) != tc.want {
			t.Errorf("Marshal(%+v) = %s, %v; want %s", tc.re, b, err, tc.want)
		}
	}
}
