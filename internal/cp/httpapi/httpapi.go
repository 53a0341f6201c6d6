// Package httpapi is what every room of the control plane's HTTP API
// shares: the error type (an api.CodedError with a status) and its JSON
// envelope, strict JSON decoding, correlation ids, operator authentication
// (bearer tokens and roles), per-client rate limits, per-key concurrency
// caps, the per-node long-poll caps of the node routes (LongPolls),
// per-node long-poll waiters, and requests parked without a goroutine on a
// transport that can hold them (Park, ParkedWait).
package httpapi

import (
	"bytes"
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

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// MaxBody bounds every request body the control plane reads.
const MaxBody = 1 << 20

type ctxKey int

const (
	ctxCorrelation ctxKey = iota
	ctxActor
)

// correlationHeaderKey is api.HeaderCorrelationID in canonical form (the
// key net/http's Header methods use).
const correlationHeaderKey = "X-Correlation-Id"

var correlationRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// NewID returns a random id with a prefix, e.g. "tsk_5f2c...".
func NewID(prefix string) string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	var out [64]byte // one allocation (the string) for the usual short prefix
	id := append(append(out[:0], prefix...), make([]byte, hex.EncodedLen(len(b)))...)
	hex.Encode(id[len(prefix):], b[:])
	return string(id)
}

// ValidCorrelationID reports whether cid is a correlation id the control
// plane keeps (1-128 characters of [A-Za-z0-9._:-]).
func ValidCorrelationID(cid string) bool { return correlationRE.MatchString(cid) }

// WithCorrelation reads X-Correlation-ID (generating one when absent or
// malformed), stores it in the context and echoes it on the response. A
// request whose context Correlated made is passed on as it is.
func WithCorrelation(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, correlate(w, r)) // long-polls park below this frame: keep it small
	})
}

// correlate is r with its correlation id in the context, echoed on w.
//
//go:noinline
func correlate(w http.ResponseWriter, r *http.Request) *http.Request {
	if c, ok := r.Context().(*correlationCtx); ok {
		if _, echoed := w.Header()[correlationHeaderKey]; !echoed {
			w.Header()[correlationHeaderKey] = c.header[:]
		}
		return r
	}
	return r.WithContext(correlated(r.Context(), r.Header, w.Header()))
}

// Correlated is the context of a request with header fields req, to be
// answered with header fields resp, for a server that makes its own
// *http.Request (the node listener's framed connections): parent with the
// request's correlation id (X-Correlation-ID, or a new one when absent or
// malformed), echoed in resp. WithCorrelation passes a request made with
// it on as it is, instead of copying it to change its context: a copy
// for each of tens of thousands of heartbeats a second.
func Correlated(parent context.Context, req, resp http.Header) context.Context {
	return correlated(parent, req, resp)
}

// correlated is Correlated; net/http canonicalises request header keys,
// as nodemux does, so there is no Get, which would canonicalise again.
func correlated(parent context.Context, req, resp http.Header) *correlationCtx {
	var cid string
	if v := req[correlationHeaderKey]; len(v) > 0 {
		cid = v[0]
	}
	if !ValidCorrelationID(cid) {
		cid = NewID("cid_")
	}
	c := &correlationCtx{Context: parent, cid: cid}
	c.header[0] = cid
	resp[correlationHeaderKey] = c.header[:] // one allocation for the header and the context
	return c
}

// correlationCtx carries a request's correlation id (what
// context.WithValue would, with the response header's value in the same
// allocation: every request goes through it).
type correlationCtx struct {
	context.Context
	cid    string
	header [1]string
}

// Value answers ctxCorrelation with c itself (a pointer in an interface
// costs no allocation; the string would).
func (c *correlationCtx) Value(key any) any {
	if key == ctxCorrelation {
		return c
	}
	return c.Context.Value(key)
}

// CorrelationID is the request's correlation id ("" outside a request).
func CorrelationID(ctx context.Context) string {
	if c, _ := ctx.Value(ctxCorrelation).(*correlationCtx); c != nil {
		return c.cid
	}
	return ""
}

// Actor is how audit records and created_by fields name the request's
// principal ("" when there is none).
func Actor(ctx context.Context) string {
	s, _ := ctx.Value(ctxActor).(string)
	return s
}

// WithActor returns ctx naming actor as the principal ("node:<id>" for
// what the control plane does on a node's behalf).
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, ctxActor, actor)
}

// Error is an api.CodedError (code, message, fields) with an HTTP status:
// WriteError writes it as the JSON error envelope. Phase and the cause are
// not part of the envelope.
type Error struct {
	api.CodedError
	Status     int
	RetryAfter int // seconds; 0 = none
}

// Error is "status code: message".
func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// Errorf is an Error with a formatted message.
func Errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, CodedError: api.CodedError{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// Invalid is the 422 invalid_payload error of fields.
func Invalid(fields []api.FieldError) *Error {
	msg := "invalid payload"
	if len(fields) > 0 {
		msg = fields[0].Field + ": " + fields[0].Message
	}
	return &Error{Status: http.StatusUnprocessableEntity,
		CodedError: api.CodedError{Code: "invalid_payload", Message: msg, Fields: fields}}
}

// WriteJSON writes v with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError writes the error envelope; errors that are not *Error are
// 500s and logged.
func WriteError(log *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	he := AsError(log, r, err)
	if he.RetryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(he.RetryAfter))
	}
	if he.Status >= 400 && he.Status < 500 {
		level := slog.LevelInfo
		if he.Status == http.StatusPreconditionFailed {
			level = slog.LevelDebug // a conditional request's usual answer (every agent's, after a restart)
		}
		log.Log(r.Context(), level, "request refused", "status", he.Status, "code", he.Code,
			"msg", he.Message, "path", r.URL.Path, "correlation_id", CorrelationID(r.Context()))
	}
	WriteJSON(w, he.Status, api.ErrorBody{Error: he.Detail(r.Context())})
}

// AsError is err as the *Error it is, or, logged, the 500 internal error
// that stands for any other error.
func AsError(log *slog.Logger, r *http.Request, err error) *Error {
	var he *Error
	if !errors.As(err, &he) {
		log.ErrorContext(r.Context(), "internal error", "err", err, "path", r.URL.Path,
			"correlation_id", CorrelationID(r.Context()))
		he = Errorf(http.StatusInternalServerError, "internal", "internal error")
	}
	return he
}

// Detail is the error envelope's body of e for a request with ctx.
func (e *Error) Detail(ctx context.Context) api.ErrorDetail {
	return api.ErrorDetail{Code: e.Code, Message: e.Message, Fields: e.Fields, CorrelationID: CorrelationID(ctx),
		Retryable: e.Status == http.StatusTooManyRequests || e.Status >= 500}
}

// DecodeJSON strictly decodes a bounded body into v.
func DecodeJSON(r *http.Request, v any) error {
	return decodeStrict(io.LimitReader(r.Body, MaxBody), v)
}

// DecodeJSONBytes is DecodeJSON of a body read with AppendBody.
func DecodeJSONBytes(body []byte, v any) error {
	return decodeStrict(bytes.NewReader(body), v)
}

func decodeStrict(rd io.Reader, v any) error {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalidJSON(err)
	}
	return nil
}

func invalidJSON(err error) *Error {
	return &Error{Status: http.StatusUnprocessableEntity,
		CodedError: api.CodedError{Code: "invalid_json", Message: "request body: " + err.Error()}}
}

// AppendBody appends the request body, at most MaxBody bytes of it (what
// DecodeJSON reads), to dst: with a reused dst, reading a small body
// allocates nothing. A read error is DecodeJSON's invalid_json.
func AppendBody(dst []byte, body io.Reader) ([]byte, error) {
	limit := len(dst) + MaxBody
	for len(dst) < limit {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := body.Read(dst[len(dst):min(cap(dst), limit)])
		dst = dst[:len(dst)+n]
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, invalidJSON(err)
		}
	}
	return dst, nil
}

// HandlerFunc is a handler that returns its error instead of writing it.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Handle adapts f to http.Handler: its error is written with WriteError.
func Handle(log *slog.Logger, f HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := f(w, r); err != nil {
			WriteError(log, w, r, err)
		}
	})
}

// Logger returns log carrying the request's correlation id.
func Logger(ctx context.Context, log *slog.Logger) *slog.Logger {
	return log.With("correlation_id", CorrelationID(ctx))
}

// StoreError maps the store's ErrNotFound and ErrConflict on a kind of
// object ("task", "allocation") to 404 <kind>_not_found and 409
// <kind>_conflict; other errors pass through.
func StoreError(err error, kind, id string) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return Errorf(http.StatusNotFound, kind+"_not_found", "%s %q not found", kind, id)
	case errors.Is(err, store.ErrConflict):
		return Errorf(http.StatusConflict, kind+"_conflict", "%s %q: %v", kind, id, err)
	}
	return err
}
