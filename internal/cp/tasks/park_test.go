package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/httpapi/parktest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// pollReq is a long-poll request of n1 with ?timeout=timeout and ctx.
func pollReq(ctx context.Context, timeout string) *http.Request {
	return httptest.NewRequestWithContext(ctx, http.MethodGet, "/internal/v1/nodes/n1/tasks/wait?timeout="+timeout, nil)
}

// delivered waits for pd's end: the task id its 200 answer delivered.
func delivered(t *testing.T, pd *parktest.Pending) string {
	t.Helper()
	w, err := pd.Wait(t)
	var d api.TaskDelivery
	if err != nil || w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &d) != nil {
		t.Fatalf("answer %d %q (%v), want a delivery", w.Code, w.Body.Bytes(), err)
	}
	return d.TaskID
}

// TestWaitDeliversLaterTask: a waiting long-poll is answered with a task
// enqueued after it parked, and only then.
func TestWaitDeliversLaterTask(t *testing.T) {
	for _, m := range parktest.Modes() {
		t.Run(m.String(), func(t *testing.T) {
			r, _ := newWaitRoom(t, time.Hour)
			pd := m.Start(t, r.Wait, pollReq(t.Context(), "1m"), "n1")
			parktest.Eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
			time.Sleep(10 * time.Millisecond)
			if pd.Ended() {
				t.Fatal("answered before any task was enqueued")
			}
			tk := echoTask(t, r)
			if err := r.Enqueue(t.Context(), tk); err != nil {
				t.Fatal(err)
			}
			if got := delivered(t, pd); got != tk.ID {
				t.Fatalf("delivered %s, want %s", got, tk.ID)
			}
			if n := r.waiters.Count(); n != 0 {
				t.Fatalf("%d waiters left", n)
			}
		})
	}
}

// TestWaitRevokedOnWake: a poll woken after its node was revoked is
// answered 403 node_identity_revoked.
func TestWaitRevokedOnWake(t *testing.T) {
	for _, m := range parktest.Modes() {
		t.Run(m.String(), func(t *testing.T) {
			r, _ := newWaitRoom(t, time.Hour)
			pd := m.Start(t, r.Wait, pollReq(t.Context(), "1m"), "n1")
			parktest.Eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
			r.nodes.(*fakeNodes).revoked.Store(true)
			r.Wake("n1")
			var he *httpapi.Error
			if _, err := pd.Wait(t); !errors.As(err, &he) || he.Status != http.StatusForbidden || he.Code != "node_identity_revoked" {
				t.Fatalf("woken after revocation: %v, want 403 node_identity_revoked", err)
			}
			if n := r.waiters.Count(); n != 0 {
				t.Fatalf("%d waiters left", n)
			}
		})
	}
}

// TestWaitParkedPanicOnWake: a parked poll whose resumed claim panics
// aborts its request (the transport drops it) and still removes its
// waiter and runs the rest of its chain with a nil error (a long-poll
// slot is released), as a panic unwinds a blocking handler's defers.
func TestWaitParkedPanicOnWake(t *testing.T) {
	r, _ := newWaitRoom(t, time.Hour)
	pd := parktest.Parked.Start(t, r.Wait, pollReq(t.Context(), "1m"), "n1")
	parktest.Eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
	r.nodes.(*fakeNodes).panics.Store(true)
	r.Wake("n1")
	v, err := pd.WaitAbort(t)
	if v != "node lookup bug" {
		t.Fatalf("aborted with %v, want the panic's value", v)
	}
	if n := r.waiters.Count(); n != 0 || err != nil {
		t.Fatalf("%d waiters left, chain's error %v; want none, nil", n, err)
	}
}

// TestWaitCancelled: a poll whose request is cancelled ends without an
// answer (nil: the transport sends nothing), and frees its waiter and its
// long-poll slot, which it held until then.
func TestWaitCancelled(t *testing.T) {
	for _, m := range parktest.Modes() {
		t.Run(m.String(), func(t *testing.T) {
			r, _ := newWaitRoom(t, time.Hour)
			reg := prometheus.NewRegistry()
			h := httpapi.NewLongPolls("tasks", 1, reg, httpapi.NewLimitRefusals(reg)).Limit(nil, r.Wait)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			pd := m.Start(t, h, pollReq(ctx, "1m"), "n1")
			parktest.Eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
			var he *httpapi.Error
			if _, err := m.Start(t, h, pollReq(t.Context(), "0s"), "n1").Wait(t); !errors.As(err, &he) || he.Status != http.StatusTooManyRequests {
				t.Fatalf("a second poll while the first waits: %v, want 429", err)
			}
			cancel()
			if w, err := pd.Wait(t); err != nil || w.Wrote {
				t.Fatalf("cancelled poll: %v, wrote %v; want nothing", err, w.Wrote)
			}
			if n := r.waiters.Count(); n != 0 {
				t.Fatalf("%d waiters left", n)
			}
			if w, err := m.Start(t, h, pollReq(t.Context(), "0s"), "n1").Wait(t); err != nil || w.Code != http.StatusNoContent {
				t.Fatalf("a poll after the cancelled one: %d %v, want 204", w.Code, err)
			}
		})
	}
}

// TestWaitEventDuringFirstClaim: a wake, or the request's end, that comes
// while the wait makes its first claim (before it parks) is not lost.
func TestWaitEventDuringFirstClaim(t *testing.T) {
	for _, m := range parktest.Modes() {
		for _, tc := range []struct {
			name    string
			wake    bool // else cancel
			deliver bool
		}{
			{"wake", true, true},
			{"cancel", false, false},
		} {
			t.Run(m.String()+"/"+tc.name, func(t *testing.T) {
				r, cs := newWaitRoom(t, time.Hour)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				var once sync.Once
				event := func() {
					once.Do(func() {
						if !tc.wake {
							cancel()
							return
						}
						if err := cs.EnqueueTask(t.Context(), echoTask(t, r)); err != nil { // its event is not seen
							t.Error(err)
						}
						r.Wake("n1")
					})
				}
				cs.afterClaim.Store(&event)
				pd := m.Start(t, r.Wait, pollReq(ctx, "1m"), "n1")
				if tc.deliver {
					delivered(t, pd)
				} else if w, err := pd.Wait(t); err != nil || w.Wrote {
					t.Fatalf("cancelled poll: %v, wrote %v; want nothing", err, w.Wrote)
				}
				if n := r.waiters.Count(); n != 0 {
					t.Fatalf("%d waiters left", n)
				}
			})
		}
	}
}

// TestWaitParkedHoldsNoGoroutine: a parked wait's handler returns at once,
// before any answer, and the waits then hold no goroutine; a wake runs
// each woken one on a goroutine that ends when it parks again or answers.
func TestWaitParkedHoldsNoGoroutine(t *testing.T) {
	r, _ := newWaitRoom(t, time.Hour)
	const n = 50
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	before := runtime.NumGoroutine()
	pds := make([]*parktest.Pending, n)
	for i := range pds {
		pds[i] = parktest.Parked.Start(t, r.Wait, pollReq(ctx, "1m"), "n1")
		if pds[i].Park == nil || pds[i].Ended() || pds[i].Rec.Wrote {
			t.Fatalf("poll %d: parked %v, ended %v, wrote %v; want parked with nothing written", i,
				pds[i].Park != nil, pds[i].Ended(), pds[i].Rec.Wrote)
		}
	}
	// The SQLite driver's goroutines of the first claims end shortly after
	// them: the count settles, a goroutine per parked wait would not.
	parktest.Eventually(t, "the parked waits hold no goroutine", func() bool { return runtime.NumGoroutine()-before <= n/10 })
	if got := r.waiters.Count(); got != n {
		t.Fatalf("%d waiters, want %d", got, n)
	}

	tk := echoTask(t, r)
	if err := r.Enqueue(t.Context(), tk); err != nil { // wakes all n: one claims it
		t.Fatal(err)
	}
	parktest.Eventually(t, "one wait delivered", func() bool { return r.waiters.Count() == n-1 })
	var answered []*parktest.Pending
	for _, pd := range pds {
		if pd.Ended() {
			answered = append(answered, pd)
		}
	}
	if len(answered) != 1 || delivered(t, answered[0]) != tk.ID {
		t.Fatalf("%d waits answered, want the one that delivered %s", len(answered), tk.ID)
	}
	parktest.Eventually(t, "the woken waits parked again", func() bool { return runtime.NumGoroutine()-before <= n/10 })

	cancel()
	for _, pd := range pds {
		if w, err := pd.Wait(t); pd != answered[0] && (err != nil || w.Wrote) {
			t.Fatalf("cancelled wait: %v, wrote %v; want nothing", err, w.Wrote)
		}
	}
	if got := r.waiters.Count(); got != 0 {
		t.Fatalf("%d waiters left", got)
	}
}

// TestWaitParkedWakeAtTimeout: a parked wait whose time is up answers 204
// and marks its node quiet, unless a wake came that its last claim did not
// follow (one that came as it settled).
func TestWaitParkedWakeAtTimeout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		wake      bool
		wantQuiet bool
	}{
		{"no wake", false, true},
		{"a wake pending", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newWaitRoom(t, time.Hour)
			w := httptest.NewRecorder()
			pl := &poll{s: r, w: w, r: pollReq(t.Context(), "1m"), max: 1}
			pl.Start(pl, r.waiters, "n1") // run by this goroutine until it parks
			if tc.wake {
				r.Wake("n1") // the poll is running (here): only its flag is set
			}
			if err := pl.TimedOut(); err != nil {
				t.Fatal(err)
			}
			pl.Stop()
			if w.Code != http.StatusNoContent || r.waiters.Quiet("n1") != tc.wantQuiet || r.waiters.Count() != 0 {
				t.Fatalf("status %d, quiet %v, %d waiters; want 204, quiet %v, none", w.Code, r.waiters.Quiet("n1"),
					r.waiters.Count(), tc.wantQuiet)
			}
		})
	}
}

// TestWaitParkedEventsRace: parked waits under a storm of wakes, with
// timeouts and cancellations racing them, each end exactly once, with an
// answer or (cancelled) none, and leave no waiter.
func TestWaitParkedEventsRace(t *testing.T) {
	r, _ := newWaitRoom(t, time.Hour)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopEvents := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopEvents()
	for i := range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch i {
				case 0:
					r.Wake("n1")
				case 1:
					r.WakeAll()
				default:
					if err := r.Enqueue(t.Context(), echoTask(t, r)); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
				time.Sleep(50 * time.Microsecond)
			}
		})
	}
	const n = 200
	pds := make([]*parktest.Pending, n)
	for i := range pds {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		pds[i] = parktest.Parked.Start(t, r.Wait, pollReq(ctx, fmt.Sprintf("%dus", i%41*500)), "n1")
		if i%3 == 0 {
			go func() { time.Sleep(time.Duration(i%5) * 100 * time.Microsecond); cancel() }()
		}
	}
	// The waits still parked then end by their own timeout, with no wake
	// after it: a timeout lost as a woken wait parked again would show.
	time.Sleep(10 * time.Millisecond)
	stopEvents()
	statuses := map[int]int{}
	for _, pd := range pds {
		w, err := pd.Wait(t)
		if err != nil && !errors.Is(err, context.Canceled) { // cancelled during a claim: as Wait's
			t.Fatalf("wait: %v", err)
		}
		if w.Wrote {
			statuses[w.Code]++
		}
	}
	time.Sleep(20 * time.Millisecond) // a second end would show
	for i, pd := range pds {
		if pd.Park != nil && pd.Ends() != 1 {
			t.Fatalf("wait %d ended %d times", i, pd.Ends())
		}
	}
	for code := range statuses {
		if code != http.StatusOK && code != http.StatusNoContent {
			t.Fatalf("statuses %v", statuses)
		}
	}
	if got := r.waiters.Count(); got != 0 {
		t.Fatalf("%d waiters left", got)
	}
	t.Logf("statuses %v", statuses)
}
