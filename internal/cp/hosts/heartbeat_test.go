package hosts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/prometheus/client_golang/prometheus"
)

// serveBeat sends one heartbeat of host id through the handler: body (none
// if nil) and header names and values in pairs (hdr). It returns the
// recorded answer and the handler's error.
func serveBeat(t *testing.T, s *Room, id string, body []byte, hdr ...string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	hs, err := s.cache.get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	var rd io.Reader = http.NoBody
	if body != nil {
		rd = bytes.NewReader(body)
	}
	r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/internal/v1/nodes/"+id+"/heartbeat", rd)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	return w, s.Heartbeat(w, r, Caller{ID: id, state: hs})
}

// TestHeartbeatAnswer: a heartbeat is answered with the interval, as a
// HeartbeatResponse body, or with Prefer: return=minimal as a 204 with
// Drover-Heartbeat-Interval and no body (one HEADERS frame).
func TestHeartbeatAnswer(t *testing.T) {
	rs := newReplicas(t, "n1")
	s := rs.room()
	body := mustJSON(t, api.Heartbeat{AgentVersion: "1", Capacity: capacity(8192)})
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
			var hdr []string
			for _, v := range tc.prefer {
				hdr = append(hdr, api.HeaderPrefer, v)
			}
			w, err := serveBeat(t, s, "n1", body, hdr...)
			if err != nil {
				t.Fatal(err)
			}
			if got := w.Header().Get("ETag"); got != sumOf(body).etag() || len(got) != 34 {
				t.Fatalf("ETag %q, want the body's digest %q", got, sumOf(body).etag())
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

// beatIfMatch sends a body-less heartbeat with If-Match values; it returns
// the status (the error's, if the handler failed) and the answer's ETag.
func beatIfMatch(t *testing.T, s *Room, id string, match ...string) (int, string) {
	t.Helper()
	var hdr []string
	for _, m := range match {
		hdr = append(hdr, "If-Match", m)
	}
	w, err := serveBeat(t, s, id, nil, hdr...)
	if err != nil {
		var he *httpapi.Error
		if !errors.As(err, &he) {
			t.Fatalf("heartbeat: %v", err)
		}
		if he.Status == http.StatusPreconditionFailed && he.Code != "heartbeat_state_unknown" {
			t.Fatalf("412 with code %q", he.Code)
		}
		return he.Status, ""
	}
	return w.Code, w.Header().Get("ETag")
}

// TestHeartbeatIfMatch: a body-less heartbeat whose If-Match is the ETag
// of the host's last heartbeat on this replica repeats it (liveness
// recorded, nothing decoded); any other tag, another host's, a replica
// that does not hold it, or a tag from before a change is refused with 412
// heartbeat_state_unknown, and a body-less heartbeat without If-Match is
// invalid.
func TestHeartbeatIfMatch(t *testing.T) {
	rs := newReplicas(t, "n1", "n2")
	a, b := rs.room(), rs.room()
	hb1 := api.Heartbeat{AgentVersion: "1", Capacity: capacity(8192)}
	body1 := mustJSON(t, hb1)
	tag1 := sumOf(body1).etag()
	beat(t, a, "n1", hb1)
	beat(t, a, "n2", api.Heartbeat{AgentVersion: "2", Capacity: capacity(4096)})
	tag2 := sumOf(mustJSON(t, api.Heartbeat{AgentVersion: "2", Capacity: capacity(4096)})).etag()

	rs.clock.advance(time.Second)
	if status, tag := beatIfMatch(t, a, "n1", tag1); status != http.StatusOK || tag != tag1 {
		t.Fatalf("If-Match of the last heartbeat: %d, ETag %q", status, tag)
	}
	a.Flush(t.Context())
	if h := rs.host(t, "n1"); !h.LastSeenAt.Equal(rs.clock.Now()) || h.Status != api.HostHealthy {
		t.Fatalf("body-less heartbeat not recorded: last seen %s, want %s; %s", h.LastSeenAt, rs.clock.Now(), h.Status)
	}
	for _, tc := range []struct {
		name  string
		room  *Room
		match []string
		want  int
	}{
		{"unknown tag", a, []string{`"00000000000000000000000000000000"`}, http.StatusPreconditionFailed},
		{"unquoted tag", a, []string{tag1[1 : len(tag1)-1]}, http.StatusPreconditionFailed},
		{"another host's tag", a, []string{tag2}, http.StatusPreconditionFailed},
		{"two tags", a, []string{tag1, tag1}, http.StatusPreconditionFailed},
		{"star", a, []string{"*"}, http.StatusPreconditionFailed},
		{"replica without it", b, []string{tag1}, http.StatusPreconditionFailed},
		{"no If-Match", a, nil, http.StatusUnprocessableEntity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if status, _ := beatIfMatch(t, tc.room, "n1", tc.match...); status != tc.want {
				t.Fatalf("status %d, want %d", status, tc.want)
			}
		})
	}

	// With a body, If-Match is not looked at: the body is the heartbeat.
	w, err := serveBeat(t, a, "n1", body1, "If-Match", `"00000000000000000000000000000000"`)
	if err != nil || w.Header().Get("ETag") != tag1 {
		t.Fatalf("body with a stale If-Match: %v, ETag %q", err, w.Header().Get("ETag"))
	}

	// A changed heartbeat: the old tag no longer matches, the new one does.
	hb1.Capacity = capacity(1024)
	beat(t, a, "n1", hb1)
	if status, _ := beatIfMatch(t, a, "n1", tag1); status != http.StatusPreconditionFailed {
		t.Fatalf("tag from before the change: %d, want 412", status)
	}
	if status, _ := beatIfMatch(t, a, "n1", sumOf(mustJSON(t, hb1)).etag()); status != http.StatusOK {
		t.Fatalf("tag of the changed heartbeat: %d", status)
	}
	// An entry dropped after staleAfter silent intervals is gone with its tag.
	a.Flush(t.Context())
	rs.clock.advance(staleAfter*testInterval + time.Second)
	a.Flush(t.Context())
	if status, _ := beatIfMatch(t, a, "n1", sumOf(mustJSON(t, hb1)).etag()); status != http.StatusPreconditionFailed {
		t.Fatalf("tag of a forgotten entry: %d, want 412", status)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// capacityProbe checks, as a host's status turns healthy, that its
// capacity is stored already: a placement that sees the host healthy (an
// operator who creates an instance at once) must find what it can hold.
type capacityProbe struct {
	Store
	missed []string
}

func (p *capacityProbe) UpdateHostAudited(ctx context.Context, id string, fn func(*store.Host) error,
	audit func(before, after store.Host) []store.AuditEvent) (store.Host, error) {
	h, err := p.Store.UpdateHostAudited(ctx, id, fn, audit)
	if err == nil && h.Status == api.HostHealthy && len(h.Capacity) == 0 {
		p.missed = append(p.missed, id+" healthy before its capacity was stored")
	}
	return h, err
}

// TestFirstHeartbeatStoresCapacityBeforeHealthy: the first heartbeat's
// capacity is written before the status it makes healthy.
func TestFirstHeartbeatStoresCapacityBeforeHealthy(t *testing.T) {
	rs := newReplicas(t, "n1")
	p := &capacityProbe{Store: rs.st}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(Config{HeartbeatInterval: testInterval, Log: log, Now: rs.clock.Now}, p, nil, nil, nil,
		audit.New(rs.st, rs.clock.Now, log), NewMetrics(prometheus.NewRegistry()))
	if _, err := serveBeat(t, s, "n1", mustJSON(t, api.Heartbeat{AgentVersion: "1", Capacity: capacity(8192)})); err != nil {
		t.Fatal(err)
	}
	if h := rs.host(t, "n1"); h.Status != api.HostHealthy || len(h.Capacity) == 0 {
		t.Fatalf("after the first heartbeat: status %s, capacity %s", h.Status, h.Capacity)
	}
	for _, m := range p.missed {
		t.Error(m)
	}
}
