package httpapi

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestErrorEnvelope: an *Error (wrapped or not) is written as the JSON
// error envelope with its status, code, message, fields and Retry-After;
// its Error() is "status code: message" and api.ErrorCode reads its code.
func TestErrorEnvelope(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	he := &Error{Status: http.StatusTooManyRequests, RetryAfter: 3, CodedError: api.CodedError{Code: "rate_limited",
		Message: "slow down", Fields: []api.FieldError{{Field: "name", Message: "bad"}}}}
	if got := he.Error(); got != "429 rate_limited: slow down" {
		t.Errorf("Error() %q", got)
	}
	err := fmt.Errorf("register: %w", he)
	if got := api.ErrorCode(err); got != "rate_limited" {
		t.Errorf("api.ErrorCode %q", got)
	}
	h := WithCorrelation(Handle(log, func(http.ResponseWriter, *http.Request) error { return err }))
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	r.Header.Set(api.HeaderCorrelationID, "cid-1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	want := `{"error":{"code":"rate_limited","message":"slow down","fields":[{"field":"name","message":"bad"}],` +
		`"correlation_id":"cid-1","retryable":true}}` + "\n"
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "3" || w.Body.String() != want {
		t.Errorf("got %d %q %s, want 429, Retry-After 3, %s", w.Code, w.Header().Get("Retry-After"), w.Body, want)
	}
}

// TestRefusalLogLevel: a refusal is logged at info, except a 412 (a
// conditional request's usual answer, every agent's after a restart),
// which is logged at debug.
func TestRefusalLogLevel(t *testing.T) {
	for _, tc := range []struct {
		err  *Error
		want slog.Level
	}{
		{Errorf(http.StatusForbidden, "node_mismatch", "wrong node"), slog.LevelInfo},
		{Errorf(http.StatusPreconditionFailed, "heartbeat_state_unknown", "send the body"), slog.LevelDebug},
	} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		r := httptest.NewRequest(http.MethodPost, "/x", nil)
		WriteError(log, httptest.NewRecorder(), r, tc.err)
		if want := "level=" + tc.want.String(); !strings.Contains(buf.String(), want) {
			t.Errorf("%d: logged %q, want %s", tc.err.Status, buf.String(), want)
		}
	}
}
