package httpapi

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLongPollsLimit: past the cap a node's poll is refused with 429
// node_long_poll_limit and Retry-After and counted; requests that are not
// polls, and other nodes, are not held back.
func TestLongPollsLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	refusals := NewLimitRefusals(reg)
	lp := NewLongPolls("instances", 1, reg, refusals)
	hold, held := make(chan struct{}), make(chan struct{})
	first := true
	h := lp.Limit(WaitRequested, func(w http.ResponseWriter, r *http.Request, nodeID string) error {
		if first && WaitRequested(r) && nodeID == "n1" {
			first = false
			close(held)
			<-hold
		}
		return nil
	})
	poll := httptest.NewRequest(http.MethodGet, "/x?wait=30s", nil)
	done := make(chan error)
	go func() { done <- h(httptest.NewRecorder(), poll, "n1") }()
	<-held
	err := h(httptest.NewRecorder(), poll, "n1")
	var he *Error
	if !errors.As(err, &he) || he.Status != http.StatusTooManyRequests || he.Code != CodeNodeLongPollLimit || he.RetryAfter != 5 {
		t.Fatalf("second poll: %v, want 429 %s", err, CodeNodeLongPollLimit)
	}
	if err := h(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/x", nil), "n1"); err != nil {
		t.Fatalf("a request without wait: %v", err)
	}
	if err := h(httptest.NewRecorder(), poll, "n2"); err != nil {
		t.Fatalf("another node: %v", err)
	}
	if n := counterValue(t, reg, "drover_limit_refusals_total"); n != 1 {
		t.Fatalf("refusals %v, want 1", n)
	}
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := h(httptest.NewRecorder(), poll, "n1"); err != nil {
		t.Fatalf("after the first poll ended: %v", err)
	}
}

// counterValue is the value of the one series of counter name in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no single series %s", name)
	return 0
}
