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
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

// mode is how a test's long-polls are served.
type mode struct {
	name   string
	parked bool // by a transport that parks requests (the framed node connection), else as net/http does
}

var (
	blocking = mode{"blocking", false}
	parked   = mode{"parked", true}
	modes    = []mode{blocking, parked}
)

// recorder is a ResponseRecorder that notes whether anything was written.
type recorder struct {
	*httptest.ResponseRecorder
	wrote bool
}

func (w *recorder) WriteHeader(code int) { w.wrote = true; w.ResponseRecorder.WriteHeader(code) }

func (w *recorder) Write(b []byte) (int, error) { w.wrote = true; return w.ResponseRecorder.Write(b) }

// parkRecorder is a recorder of a transport that parks requests: done is
// closed when the parked request ends (ends counts how often it did). As
// the framed connection does, it gives a parked request up (Park.Cancel)
// when the request's context ends.
type parkRecorder struct {
	*recorder
	ctx     context.Context
	done    chan struct{}
	ends    atomic.Int32
	aborted atomic.Value
}

func (w *parkRecorder) Park() *httpapi.Park {
	end := func() {
		if w.ends.Add(1) == 1 {
			close(w.done)
		}
	}
	p := httpapi.NewPark(end, func(v any) { w.aborted.Store(fmt.Sprint(v)); end() })
	context.AfterFunc(w.ctx, p.Cancel)
	return p
}

// pending is a long-poll in flight.
type pending struct {
	w      *recorder
	pw     *parkRecorder // parked mode
	parked *httpapi.Park // the Park its handler returned, if it parked
	err    error         // the handler's, or the parked request's final error
	done   chan struct{}
}

// result is how a long-poll ended.
type result struct {
	code  int
	wrote bool
	body  []byte
	err   error
}

// start runs h for node n1's req. Parked: on the test's goroutine, which
// it returns to (as the top of the request's chain, it then marks the
// chain returned); blocking: on a goroutine of its own.
func (m mode) start(t *testing.T, h httpapi.NodeHandler, req *http.Request) *pending {
	t.Helper()
	pd := &pending{w: &recorder{ResponseRecorder: httptest.NewRecorder()}, done: make(chan struct{})}
	if !m.parked {
		go func() { pd.err = h(pd.w, req, "n1"); close(pd.done) }()
		return pd
	}
	pd.pw = &parkRecorder{recorder: pd.w, ctx: req.Context(), done: pd.done}
	err := h(pd.pw, req, "n1")
	p, ok := httpapi.ParkOf(err)
	if !ok {
		pd.err = err
		close(pd.done)
		return pd
	}
	pd.parked = p
	p.Then(func(err error) error { pd.err = err; return nil })
	p.Returned()
	return pd
}

// ended reports whether the long-poll ended.
func (pd *pending) ended() bool {
	select {
	case <-pd.done:
		return true
	default:
		return false
	}
}

// result waits for the long-poll's end.
func (pd *pending) result(t *testing.T) result {
	t.Helper()
	select {
	case <-pd.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the long-poll did not end")
	}
	if pd.pw != nil {
		if v := pd.pw.aborted.Load(); v != nil {
			t.Fatalf("the parked request was aborted: %v", v)
		}
	}
	return result{code: pd.w.Code, wrote: pd.w.wrote, body: pd.w.Body.Bytes(), err: pd.err}
}

// pollReq is a long-poll request of n1 with ?timeout=timeout and ctx.
func pollReq(ctx context.Context, timeout string) *http.Request {
	return httptest.NewRequestWithContext(ctx, http.MethodGet, "/internal/v1/nodes/n1/tasks/wait?timeout="+timeout, nil)
}

// eventually fails the test unless cond holds within 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not so after 5s: %s", what)
		}
	}
}

// delivered is the task id a 200 answer delivered.
func delivered(t *testing.T, res result) string {
	t.Helper()
	var d api.TaskDelivery
	if res.err != nil || res.code != http.StatusOK || json.Unmarshal(res.body, &d) != nil {
		t.Fatalf("answer %d %q (%v), want a delivery", res.code, res.body, res.err)
	}
	return d.TaskID
}

// TestWaitDeliversLaterTask: a waiting long-poll is answered with a task
// enqueued after it parked, and only then.
func TestWaitDeliversLaterTask(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r, _ := newWaitRoom(t, time.Hour)
			pd := m.start(t, r.Wait, pollReq(t.Context(), "1m"))
			eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
			time.Sleep(10 * time.Millisecond)
			if pd.ended() {
				t.Fatal("answered before any task was enqueued")
			}
			tk := echoTask(t, r)
			if err := r.Enqueue(t.Context(), tk); err != nil {
				t.Fatal(err)
			}
			if got := delivered(t, pd.result(t)); got != tk.ID {
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
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r, _ := newWaitRoom(t, time.Hour)
			pd := m.start(t, r.Wait, pollReq(t.Context(), "1m"))
			eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
			r.nodes.(*fakeNodes).revoked.Store(true)
			r.Wake("n1")
			var he *httpapi.Error
			if res := pd.result(t); !errors.As(res.err, &he) || he.Status != http.StatusForbidden || he.Code != "node_identity_revoked" {
				t.Fatalf("woken after revocation: %v, want 403 node_identity_revoked", res.err)
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
	pd := parked.start(t, r.Wait, pollReq(t.Context(), "1m"))
	eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
	r.nodes.(*fakeNodes).panics.Store(true)
	r.Wake("n1")
	select {
	case <-pd.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the poll did not end")
	}
	if v := pd.pw.aborted.Load(); v != "node lookup bug" {
		t.Fatalf("aborted with %v, want the panic's value", v)
	}
	if n := r.waiters.Count(); n != 0 || pd.err != nil {
		t.Fatalf("%d waiters left, chain's error %v; want none, nil", n, pd.err)
	}
}

// TestWaitCancelled: a poll whose request is cancelled ends without an
// answer (nil: the transport sends nothing), and frees its waiter and its
// long-poll slot, which it held until then.
func TestWaitCancelled(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r, _ := newWaitRoom(t, time.Hour)
			reg := prometheus.NewRegistry()
			h := httpapi.NewLongPolls("tasks", 1, reg, httpapi.NewLimitRefusals(reg)).Limit(nil, r.Wait)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			pd := m.start(t, h, pollReq(ctx, "1m"))
			eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
			var he *httpapi.Error
			if res := m.start(t, h, pollReq(t.Context(), "0s")).result(t); !errors.As(res.err, &he) || he.Status != http.StatusTooManyRequests {
				t.Fatalf("a second poll while the first waits: %v, want 429", res.err)
			}
			cancel()
			if res := pd.result(t); res.err != nil || res.wrote {
				t.Fatalf("cancelled poll: %v, wrote %v; want nothing", res.err, res.wrote)
			}
			if n := r.waiters.Count(); n != 0 {
				t.Fatalf("%d waiters left", n)
			}
			if res := m.start(t, h, pollReq(t.Context(), "0s")).result(t); res.err != nil || res.code != http.StatusNoContent {
				t.Fatalf("a poll after the cancelled one: %d %v, want 204", res.code, res.err)
			}
		})
	}
}

// TestWaitEventDuringFirstClaim: a wake, or the request's end, that comes
// while the wait makes its first claim (before it parks) is not lost.
func TestWaitEventDuringFirstClaim(t *testing.T) {
	for _, m := range modes {
		for _, tc := range []struct {
			name    string
			wake    bool // else cancel
			deliver bool
		}{
			{"wake", true, true},
			{"cancel", false, false},
		} {
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
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
				res := m.start(t, r.Wait, pollReq(ctx, "1m")).result(t)
				if tc.deliver {
					delivered(t, res)
				} else if res.err != nil || res.wrote {
					t.Fatalf("cancelled poll: %v, wrote %v; want nothing", res.err, res.wrote)
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
	pds := make([]*pending, n)
	for i := range pds {
		pds[i] = parked.start(t, r.Wait, pollReq(ctx, "1m"))
		if pds[i].parked == nil || pds[i].ended() || pds[i].w.wrote {
			t.Fatalf("poll %d: parked %v, ended %v, wrote %v; want parked with nothing written", i,
				pds[i].parked != nil, pds[i].ended(), pds[i].w.wrote)
		}
	}
	// The SQLite driver's goroutines of the first claims end shortly after
	// them: the count settles, a goroutine per parked wait would not.
	eventually(t, "the parked waits hold no goroutine", func() bool { return runtime.NumGoroutine()-before <= n/10 })
	if got := r.waiters.Count(); got != n {
		t.Fatalf("%d waiters, want %d", got, n)
	}

	tk := echoTask(t, r)
	if err := r.Enqueue(t.Context(), tk); err != nil { // wakes all n: one claims it
		t.Fatal(err)
	}
	eventually(t, "one wait delivered", func() bool { return r.waiters.Count() == n-1 })
	var answered []*pending
	for _, pd := range pds {
		if pd.ended() {
			answered = append(answered, pd)
		}
	}
	if len(answered) != 1 || delivered(t, answered[0].result(t)) != tk.ID {
		t.Fatalf("%d waits answered, want the one that delivered %s", len(answered), tk.ID)
	}
	eventually(t, "the woken waits parked again", func() bool { return runtime.NumGoroutine()-before <= n/10 })

	cancel()
	for _, pd := range pds {
		if res := pd.result(t); pd != answered[0] && (res.err != nil || res.wrote) {
			t.Fatalf("cancelled wait: %v, wrote %v; want nothing", res.err, res.wrote)
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
	pds := make([]*pending, n)
	for i := range pds {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		pds[i] = parked.start(t, r.Wait, pollReq(ctx, fmt.Sprintf("%dus", i%41*500)))
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
		res := pd.result(t)
		if res.err != nil && !errors.Is(res.err, context.Canceled) { // cancelled during a claim: as Wait's
			t.Fatalf("wait: %v", res.err)
		}
		if res.wrote {
			statuses[res.code]++
		}
	}
	time.Sleep(20 * time.Millisecond) // a second end would show
	for i, pd := range pds {
		if pd.parked != nil && pd.pw.ends.Load() != 1 {
			t.Fatalf("wait %d ended %d times", i, pd.pw.ends.Load())
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
