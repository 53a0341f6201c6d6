package testutil

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

// ServeAPI sends method path with body to h, with bearer as the operator
// token (none if empty), and returns the status, the error body's detail
// on a 4xx/5xx answer, and the raw body.
func ServeAPI(t *testing.T, h http.Handler, method, path, bearer, body string) (int, api.ErrorDetail, []byte) {
	t.Helper()
	r := httptest.NewRequestWithContext(t.Context(), method, path, strings.NewReader(body))
	if bearer != "" {
		r.Header.Set("Authorization", "Bearer "+bearer)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var eb api.ErrorBody
	if w.Code >= 400 {
		_ = json.Unmarshal(w.Body.Bytes(), &eb)
	}
	return w.Code, eb.Error, w.Body.Bytes()
}
