package integration

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
)

// wireLog records what each heartbeat request carried and its answer.
type wireLog struct {
	next http.RoundTripper
	mu   sync.Mutex
	reqs []wireBeat
}

type wireBeat struct {
	bodyLen       int64
	ifMatch, etag string
	status        int
}

func (l *wireLog) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.reqs = append(l.reqs, wireBeat{r.ContentLength, r.Header.Get("If-Match"), resp.Header.Get("ETag"), resp.StatusCode})
	l.mu.Unlock()
	return resp, nil
}

func (l *wireLog) take() []wireBeat {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.reqs
	l.reqs = nil
	return r
}

// TestHeartbeatOnTheWire: over real mTLS and HTTP/2, the node client's
// heartbeat gets the minimal answer (204, the interval in a header), sends
// an unchanged heartbeat without its body (If-Match the ETag it was
// answered), and when the control plane no longer holds that heartbeat
// (the same node reported another one meanwhile) gets 412 and sends the
// body at once; the host stays healthy throughout.
func TestHeartbeatOnTheWire(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := e.enroll("node-w", e.createHost("node-w").Token)
	logA := &wireLog{next: n.client.Transport}
	a, err := nodeapi.NewClient(&http.Client{Transport: logA}, e.nodeURL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := nodeapi.NewClient(n.client, e.nodeURL)
	if err != nil {
		t.Fatal(err)
	}
	hbA := api.Heartbeat{AgentVersion: "wire", Capacity: &api.CapacityReport{Total: api.Capacity{VCPUs: 2, MemoryMiB: 2048}}}
	beat := func(c *nodeapi.Client, hb api.Heartbeat) {
		t.Helper()
		resp, err := c.Heartbeat(t.Context(), "node-w", hb)
		if err != nil || resp.HeartbeatInterval <= 0 {
			t.Fatalf("heartbeat: %+v %v", resp, err)
		}
	}
	beat(a, hbA)
	first := logA.take()
	if len(first) != 1 || first[0].bodyLen <= 0 || first[0].ifMatch != "" || first[0].status != http.StatusNoContent || first[0].etag == "" {
		t.Fatalf("first heartbeat: %+v, want a body answered 204 with an ETag", first)
	}
	tag := first[0].etag
	for range 3 {
		beat(a, hbA)
		if got := logA.take(); len(got) != 1 || got[0].bodyLen != 0 || got[0].ifMatch != tag || got[0].status != http.StatusNoContent {
			t.Fatalf("unchanged heartbeat: %+v, want no body, If-Match %s, 204", got, tag)
		}
	}
	hbB := hbA
	hbB.AgentVersion = "other"
	beat(b, hbB) // the control plane now holds another heartbeat of this node
	beat(a, hbA)
	got := logA.take()
	if len(got) != 2 || got[0].ifMatch != tag || got[0].status != http.StatusPreconditionFailed ||
		got[1].bodyLen <= 0 || got[1].status != http.StatusNoContent || got[1].etag != tag {
		t.Fatalf("after another heartbeat: %+v, want 412 to If-Match, then the body", got)
	}
	if h := e.waitHostStatus("node-w", api.HostHealthy, 2*time.Second); h.Status != api.HostHealthy {
		t.Fatalf("status %s", h.Status)
	}
}
