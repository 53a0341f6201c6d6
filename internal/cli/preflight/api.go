package preflight

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/drover-dev/drover/internal/wire/signal"

	"github.com/drover-dev/drover/internal/wire/api"
)

// apiClient calls the operator API with the run's correlation id on every
// request.
type apiClient struct {
	base, token, cid string
	http             *http.Client
}

// apiError is an answer other than 2xx, or a transport failure (Status 0).
type apiError struct {
	Method, Path  string
	Status        int
	Code, Message string
	CorrelationID string
	Err           error // transport error when Status is 0
}

func (e *apiError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("%s %s: %v", e.Method, e.Path, e.Err)
	}
	msg := fmt.Sprintf("%s %s: HTTP %d", e.Method, e.Path, e.Status)
	if e.Code != "" {
		msg += " " + e.Code
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.CorrelationID != "" {
		msg += " (correlation_id " + e.CorrelationID + ")"
	}
	return msg
}

func (e *apiError) Unwrap() error { return e.Err }

// failSignal is the signal of a failed operator API call: the hop's own
// signal for an answer about the hop's subject (4xx), and
// control_plane_api_failed when the control plane itself failed (5xx) or
// could not be reached.
func failSignal(err error, own signal.Name) signal.Name {
	var ae *apiError
	if errors.As(err, &ae) && (ae.Status == 0 || ae.Status >= 500) {
		return signal.ControlPlaneFailed
	}
	return own
}

// statusOf is the HTTP status of an apiError (0 for anything else).
func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// do sends in as JSON (when not nil) and decodes a 2xx answer into out.
func (c *apiClient) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return &apiError{Method: method, Path: path, Err: err}
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set(api.HeaderCorrelationID, c.cid)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return &apiError{Method: method, Path: path, Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return &apiError{Method: method, Path: path, Err: err}
	}
	if resp.StatusCode >= 300 {
		ae := &apiError{Method: method, Path: path, Status: resp.StatusCode,
			CorrelationID: resp.Header.Get(api.HeaderCorrelationID)}
		var eb api.ErrorBody
		if json.Unmarshal(raw, &eb) == nil && eb.Error.Code != "" {
			ae.Code, ae.Message = eb.Error.Code, eb.Error.Message
			if eb.Error.CorrelationID != "" {
				ae.CorrelationID = eb.Error.CorrelationID
			}
		} else {
			ae.Message = truncate(strings.TrimSpace(string(raw)), 200)
		}
		return ae
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
