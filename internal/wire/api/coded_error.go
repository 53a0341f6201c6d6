package api

import "errors"

// CodedError is a failure with a stable, machine-readable code (the code a
// task result or an API error carries), the phase it happened in when there
// is one, a human message, the fields it concerns, and its cause. Packages
// that need their own type (so errors.As tells theirs apart) or extra
// fields embed it; ErrorCode reads the code of either.
type CodedError struct {
	Code    string
	Phase   string
	Message string
	Fields  []FieldError
	Err     error
}

// Error is "[phase: ]code: message[: cause]".
func (e *CodedError) Error() string {
	s := e.Code + ": " + e.Message
	if e.Phase != "" {
		s = e.Phase + ": " + s
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *CodedError) Unwrap() error { return e.Err }

// ErrorCode returns the code (promoted to the types that embed CodedError).
func (e *CodedError) ErrorCode() string { return e.Code }

// ErrorCode returns the code of the first coded error in err's chain (a
// *CodedError or a type embedding one), or "" when there is none.
func ErrorCode(err error) string {
	var c interface{ ErrorCode() string }
	if errors.As(err, &c) {
		return c.ErrorCode()
	}
	return ""
}
