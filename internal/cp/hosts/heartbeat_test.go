package hosts

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestHeartbeatAnswer: a heartbeat is answered with the interval, as a
// HeartbeatResponse body, or with Prefer: return=minimal as a 204 with
// Drover-Heartbeat-Interval and no body (one HEADERS frame).
func TestHeartbeatAnswer(t *testing.T) {
	rs := newReplicas(t, "n1")
	s := rs.room()
	body, _ := json.Marshal(api.Heartbeat{AgentVersion: "1", Capacity: capacity(8192)})
	for _, tc := range []struct {
		name    string
		prefer  []string
		minimal bool
	}{
		{"no preference", nil, false},
		{"representation", []string{"return=representation"}, false},
		{"minimal", []string{api.PreferMinimal}, true},
		{"minimal among others", []string{"respond-async", "wait=1, return=minimal"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs, err := s.cache.get(t.Context(), "n1")
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/internal/v1/nodes/n1/heartbeat", bytes.NewReader(body))
			for _, v := range tc.prefer {
				r.Header.Add(api.HeaderPrefer, v)
			}
			w := httptest.NewRecorder()
			if err := s.Heartbeat(w, r, Caller{ID: "n1", state: hs}); err != nil {
				t.Fatal(err)
			}
			if tc.minimal {
				if w.Code != http.StatusNoContent || w.Body.Len() != 0 || w.Header().Get(api.HeaderHeartbeatInterval) != testInterval.String() {
					t.Fatalf("minimal answer: %d %q, %s %q", w.Code, w.Body, api.HeaderHeartbeatInterval, w.Header().Get(api.HeaderHeartbeatInterval))
				}
				return
			}
			var got api.HeartbeatResponse
			if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" ||
				json.Unmarshal(w.Body.Bytes(), &got) != nil || got.HeartbeatInterval != api.Duration(testInterval) {
				t.Fatalf("answer: %d %s %q", w.Code, w.Header().Get("Content-Type"), w.Body)
			}
		})
	}
	if h := rs.host(t, "n1"); h.Status != api.HostHealthy {
		t.Fatalf("status %s after the heartbeats", h.Status)
	}
}
