package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"

	"github.com/drover-dev/drover/internal/wire/api"
)

// maxBody bounds every request body the control plane reads.
const maxBody = 1 << 20

type ctxKey int

const (
	ctxCorrelation ctxKey = iota
	ctxActor
)

var correlationRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// newID returns a random id with a prefix, e.g. "tsk_5f2c...".
func newID(prefix string) string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return prefix + hex.EncodeToString(b[:])
}

// withCorrelation reads X-Correlation-ID (generating one when absent or
// malformed), stores it in the context and echoes it on the response.
func withCorrelation(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cid := r.Header.Get(api.HeaderCorrelationID)
		if !correlationRE.MatchString(cid) {
			cid = newID("cid_")
		}
		w.Header().Set(api.HeaderCorrelationID, cid)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxCorrelation, cid)))
	})
}

func correlationID(ctx context.Context) string {
	s, _ := ctx.Value(ctxCorrelation).(string)
	return s
}

func actor(ctx context.Context) string {
	s, _ := ctx.Value(ctxActor).(string)
	return s
}

// httpError is an error with an HTTP status and a stable code.
type httpError struct {
	status     int
	code       string
	msg        string
	fields     []api.FieldError
	retryAfter int // seconds; 0 = none
}

func (e *httpError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.msg) }

func errf(status int, code, format string, args ...any) *httpError {
	return &httpError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func invalid(fields []api.FieldError) *httpError {
	msg := "invalid payload"
	if len(fields) > 0 {
		msg = fields[0].Field + ": " + fields[0].Message
	}
	return &httpError{status: http.StatusUnprocessableEntity, code: "invalid_payload", msg: msg, fields: fields}
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes the error envelope; non-httpErrors are 500s and logged.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		s.log.ErrorContext(r.Context(), "internal error", "err", err, "path", r.URL.Path,
			"correlation_id", correlationID(r.Context()))
		he = errf(http.StatusInternalServerError, "internal", "internal error")
	}
	if he.retryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(he.retryAfter))
	}
	if he.status >= 400 && he.status < 500 {
		s.log.InfoContext(r.Context(), "request refused", "status", he.status, "code", he.code,
			"msg", he.msg, "path", r.URL.Path, "correlation_id", correlationID(r.Context()))
	}
	writeJSON(w, he.status, api.ErrorBody{Error: api.ErrorDetail{
		Code: he.code, Message: he.msg, Fields: he.fields,
		CorrelationID: correlationID(r.Context()),
		Retryable:     he.status == http.StatusTooManyRequests || he.status >= 500,
	}})
}

// decodeJSON strictly decodes a bounded body into v.
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &httpError{status: http.StatusUnprocessableEntity, code: "invalid_json",
			msg: "request body: " + err.Error()}
	}
	return nil
}

// handler adapts a function returning an error to http.Handler.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) handle(f handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := f(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// logger returns a logger carrying the request's correlation id.
func (s *Server) logger(ctx context.Context) *slog.Logger {
	return s.log.With("correlation_id", correlationID(ctx))
}
