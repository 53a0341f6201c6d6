package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

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

// TestLongPollsLimitParked: a poll its handler parks holds its slot after
// the handler returned, until the request finishes (whether it finishes as
// its chain returns or later); a handler that returns or panics without
// parking gives it back at once.
func TestLongPollsLimitParked(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		// handle is the poll's handler; it returns the Park it parked, if any.
		handle     func(p *Park) (*Park, error)
		finishLate bool // Finish after the chain returned (else while it returns)
	}{
		{"parked, finished later", func(p *Park) (*Park, error) { return p, p.Err() }, true},
		{"parked, finished as the chain returns", func(p *Park) (*Park, error) { p.Finish(boom); return p, p.Err() }, false},
		{"parked, wrapped", func(p *Park) (*Park, error) { return p, fmt.Errorf("poll: %w", p.Err()) }, true},
		{"not parked", func(*Park) (*Park, error) { return nil, boom }, false},
		{"panics", func(*Park) (*Park, error) { panic(boom) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			lp := NewLongPolls("tasks", 1, reg, NewLimitRefusals(reg))
			var parked *Park
			h := lp.Limit(nil, func(w http.ResponseWriter, r *http.Request, nodeID string) error {
				var err error
				parked, err = tc.handle(w.(Parker).Park())
				return err
			})
			pr, p := newParkProbe()
			w := &parkWriter{ResponseRecorder: httptest.NewRecorder(), p: p}
			var err error
			func() {
				defer func() { _ = recover() }()
				err = h(w, httptest.NewRequest(http.MethodGet, "/x", nil), "n1")
			}()
			if parked == nil {
				if got := lp.slots.Count(); got != 0 {
					t.Fatalf("%d slots held after a handler that did not park (err %v)", got, err)
				}
				return
			}
			if got, ok := ParkOf(err); !ok || got != parked {
				t.Fatalf("Limit returned %v, not the Park's error", err)
			}
			var final error
			parked.Then(func(err error) error { final = err; return nil })
			if got := lp.slots.Count(); got != 1 {
				t.Fatalf("%d slots held by the parked poll before it finished, want 1", got)
			}
			var he *Error
			if err := h(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/x", nil), "n1"); !errors.As(err, &he) ||
				he.Status != http.StatusTooManyRequests {
				t.Fatalf("a second poll while the first is parked: %v, want a 429", err)
			}
			parked.Returned()
			if tc.finishLate {
				if got := lp.slots.Count(); got != 1 {
					t.Fatalf("%d slots held after the chain returned, before Finish; want 1", got)
				}
				parked.Finish(boom)
			}
			pr.wait(t)
			if got := lp.slots.Count(); got != 0 || final != boom {
				t.Fatalf("after Finish: %d slots held, final error %v; want 0 and %v", got, final, boom)
			}
		})
	}
}

// parkWriter is a ResponseWriter of a transport that parks requests.
type parkWriter struct {
	*httptest.ResponseRecorder
	p *Park
}

func (w *parkWriter) Park() *Park { return w.p }

// TestLongPollWait: a long-poll waits between 3/4 of what it asked and
// what it asked, never longer, and waits of one length spread over that
// range; no wait stays no wait.
func TestLongPollWait(t *testing.T) {
	const d = 30 * time.Second
	lo, hi := d, time.Duration(0)
	for range 2000 {
		w := LongPollWait(d)
		if w < d*3/4 || w > d {
			t.Fatalf("LongPollWait(%s) = %s, want within [%s, %s]", d, w, d*3/4, d)
		}
		lo, hi = min(lo, w), max(hi, w)
	}
	if hi-lo < d/5 {
		t.Errorf("2000 waits of %s spread over only %s (%s to %s)", d, hi-lo, lo, hi)
	}
	if w := LongPollWait(0); w != 0 {
		t.Errorf("LongPollWait(0) = %s, want 0", w)
	}
}

// TestGivenUp: a long-poll's error stands while its request is live, and
// is nothing once the agent gave the request up.
func TestGivenUp(t *testing.T) {
	live := httptest.NewRequest(http.MethodGet, "/", nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	gone := live.WithContext(ctx)
	failed := errors.New("read the store: boom")
	for _, tc := range []struct {
		name string
		r    *http.Request
		err  error
		want error
	}{
		{"live, no error", live, nil, nil},
		{"live, error", live, failed, failed},
		{"given up, error", gone, fmt.Errorf("claim: %w", context.Canceled), nil},
		{"given up, no error", gone, nil, nil},
	} {
		if got := GivenUp(tc.r, tc.err); !errors.Is(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
