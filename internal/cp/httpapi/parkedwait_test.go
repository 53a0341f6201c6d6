package httpapi

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	errRead     = errors.New("read failed")
	errTimedOut = errors.New("timed out") // what testWait's TimedOut returns, to tell it from a cancel
)

// testWait is a route's poll: onWake answers the n-th wake (from 1; nil:
// it never answers). It counts what the wait ran, and notes a route method
// that ran beside another or after the request finished.
type testWait struct {
	ParkedWait
	onWake   func(n int) (bool, error)
	wakes    atomic.Int32
	timeouts atomic.Int32
	inRoute  atomic.Int32
	answered atomic.Bool // a wake's read answered
	finished atomic.Bool // the chain ran
	bad      atomic.Value
}

func (tw *testWait) Woken() (bool, error) {
	defer tw.enter()()
	n := tw.wakes.Add(1)
	if tw.onWake == nil {
		return false, nil
	}
	done, err := tw.onWake(int(n))
	tw.answered.Store(done && err == nil)
	return done, err
}

func (tw *testWait) TimedOut() error {
	defer tw.enter()()
	tw.timeouts.Add(1)
	return errTimedOut
}

// enter notes a route method's run; the func it returns, its end.
func (tw *testWait) enter() func() {
	if tw.inRoute.Add(1) != 1 {
		tw.bad.Store("two route methods at once")
	}
	if tw.finished.Load() {
		tw.bad.Store("a route method after the request finished")
	}
	return func() { tw.inRoute.Add(-1) }
}

// parked is a testWait parked as a handler parks it: Start, first (the
// route's first read, with the Park the transport will give), Park, then
// the chain's top (a Then noting the final error, and Returned).
type parked struct {
	*testWait
	pr  *parkProbe
	p   *Park
	err atomic.Value // the chain's error, boxed
}

func startParked(ws *Waiters, node string, wait time.Duration, onWake func(int) (bool, error),
	first func(tw *testWait, p *Park)) *parked {
	pr, p := newParkProbe()
	pk := &parked{testWait: &testWait{onWake: onWake}, pr: pr, p: p}
	pk.Start(pk.testWait, ws, node)
	if first != nil {
		first(pk.testWait, p)
	}
	if err := pk.Park(&parkWriter{ResponseRecorder: httptest.NewRecorder(), p: p}, wait); !IsParked(err) {
		panic(fmt.Sprintf("Park returned %v", err))
	}
	p.Then(func(err error) error {
		pk.finished.Store(true)
		pk.err.Store([]error{err})
		return err
	})
	p.Returned()
	return pk
}

// chainErr is the error the request's chain got (wait for the end first).
func (pk *parked) chainErr() error {
	if v := pk.err.Load(); v != nil {
		return v.([]error)[0]
	}
	return nil
}

// TestParkedWaitEvents: each event, also one that comes before the wait
// is armed (during the route's first read, as it arms), ends the request
// once, as a blocking long-poll's select would, and disarms the wait (no
// waiter, no timer).
func TestParkedWaitEvents(t *testing.T) {
	answers := func(int) (bool, error) { return true, nil }
	for _, tc := range []struct {
		name      string
		wait      time.Duration
		onWake    func(int) (bool, error)
		first     func(ws *Waiters, p *Park) // during the first read
		after     func(ws *Waiters, p *Park) // once parked
		wantErr   error
		wantWakes int32
		wantTOs   int32
	}{
		{"wake, the read answers", time.Hour, answers, nil, func(ws *Waiters, _ *Park) { ws.Wake("n1") }, nil, 1, 0},
		{"wake, the read fails", time.Hour, func(int) (bool, error) { return false, errRead }, nil,
			func(ws *Waiters, _ *Park) { ws.WakeAll() }, errRead, 1, 0},
		{"wake, nothing read, then the timeout", 30 * time.Millisecond, nil, nil,
			func(ws *Waiters, _ *Park) { ws.Wake("n1") }, errTimedOut, 1, 1},
		{"the timeout", time.Millisecond, answers, nil, nil, errTimedOut, 0, 1},
		{"cancelled", time.Hour, answers, nil, func(_ *Waiters, p *Park) { p.Cancel() }, nil, 0, 0},
		{"a wake of another node", 30 * time.Millisecond, answers, nil,
			func(ws *Waiters, _ *Park) { ws.Wake("n2") }, errTimedOut, 0, 1},
		{"wake during the first read", time.Hour, answers, func(ws *Waiters, _ *Park) { ws.Wake("n1") }, nil, nil, 1, 0},
		{"cancelled during the first read", time.Hour, answers, func(_ *Waiters, p *Park) { p.Cancel() }, nil, nil, 0, 0},
		{"wake and cancel during the first read", time.Hour, answers, func(ws *Waiters, p *Park) {
			ws.Wake("n1")
			p.Cancel()
		}, nil, nil, 0, 0}, // the request's end comes first
		{"the timer fires as it arms", 0, answers, nil, nil, errTimedOut, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := NewWaiters()
			var first func(*testWait, *Park)
			if tc.first != nil {
				first = func(_ *testWait, p *Park) { tc.first(ws, p) }
			}
			pk := startParked(ws, "n1", tc.wait, tc.onWake, first)
			if tc.after != nil {
				tc.after(ws, pk.p)
			}
			pk.pr.wait(t)
			time.Sleep(10 * time.Millisecond) // a second end, or a late route call, would show
			pk.pr.mu.Lock()
			dones, aborts := pk.pr.dones, pk.pr.aborts
			pk.pr.mu.Unlock()
			if dones != 1 || len(aborts) != 0 || !errors.Is(pk.chainErr(), tc.wantErr) {
				t.Fatalf("%d dones, aborts %v, error %v; want one done with %v", dones, aborts, pk.chainErr(), tc.wantErr)
			}
			if w, to := pk.wakes.Load(), pk.timeouts.Load(); w != tc.wantWakes || to != tc.wantTOs {
				t.Fatalf("%d wakes read, %d timeouts; want %d, %d", w, to, tc.wantWakes, tc.wantTOs)
			}
			if v := pk.bad.Load(); v != nil {
				t.Fatal(v)
			}
			if n := ws.Count(); n != 0 || pk.timer.Stop() {
				t.Fatalf("%d waiters left, timer armed %v; want the wait disarmed", n, pk.timer.Stop())
			}
		})
	}
}

// TestParkedWaitPanic: a route method that panics aborts the request and
// still disarms the wait; the chain runs with a nil error.
func TestParkedWaitPanic(t *testing.T) {
	ws := NewWaiters()
	pk := startParked(ws, "n1", time.Hour, func(int) (bool, error) { panic("read bug") }, nil)
	ws.Wake("n1")
	if dones, aborts := pk.pr.wait(t); dones != 0 || len(aborts) != 1 || aborts[0] != "read bug" {
		t.Fatalf("%d dones, aborts %v; want one abort with the panic's value", dones, aborts)
	}
	if !pk.finished.Load() || pk.chainErr() != nil {
		t.Fatalf("chain ran %v with %v; want it run with nil", pk.finished.Load(), pk.chainErr())
	}
	if n := ws.Count(); n != 0 || pk.timer.Stop() {
		t.Fatalf("%d waiters left, timer armed %v; want the wait disarmed", n, pk.timer.Stop())
	}
}

// TestParkedWaitStop: a wait that does not park (its first read answered)
// leaves no waiter; a wake while the handler's goroutine runs it is only
// noted (WakePending), for SettleUnless.
func TestParkedWaitStop(t *testing.T) {
	ws := NewWaiters()
	tw := &testWait{}
	tw.Start(tw, ws, "n1")
	if tw.Node() != "n1" || ws.Count() != 1 || tw.WakePending() {
		t.Fatalf("node %q, %d waiters, wake pending %v; want n1, 1, false", tw.Node(), ws.Count(), tw.WakePending())
	}
	ws.Wake("n1")
	if !tw.WakePending() || tw.wakes.Load() != 0 {
		t.Fatalf("wake pending %v, %d read; want the wake noted, not run", tw.WakePending(), tw.wakes.Load())
	}
	ws.SettleUnless("n1", tw.WakePending)
	if ws.Quiet("n1") {
		t.Fatal("settled quiet with a wake pending")
	}
	tw.Stop()
	if n := ws.Count(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

// TestParkedWaitStorm: parked waits under a storm of wakes, with their
// timeouts and cancellations racing the wakes and the arming, each end
// exactly once, run one route method at a time and none after their end,
// and leave no waiter.
func TestParkedWaitStorm(t *testing.T) {
	ws := NewWaiters()
	nodes := []string{"n0", "n1", "n2"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopStorm := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopStorm()
	for i := range 4 {
		wg.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				if i == 0 && j%10 == 0 {
					ws.WakeAll()
				} else {
					ws.Wake(nodes[(i+j)%len(nodes)])
				}
			}
		})
	}
	const n = 400
	pks := make([]*parked, n)
	for i := range pks {
		var onWake func(int) (bool, error)
		if k := i % 6; k > 0 { // the k-th wake answers (or fails); k 0: none does
			onWake = func(n int) (bool, error) {
				if n < k {
					return false, nil
				}
				if i%2 == 0 {
					return false, errRead
				}
				return true, nil
			}
		}
		var first func(*testWait, *Park)
		cancel := i%5 == 0
		if cancel && i%10 == 0 {
			first = func(_ *testWait, p *Park) { p.Cancel() }
		}
		pks[i] = startParked(ws, nodes[i%len(nodes)], time.Duration(i%7)*200*time.Microsecond, onWake, first)
		if cancel {
			go pks[i].p.Cancel()
		}
	}
	for i, pk := range pks {
		pk.pr.wait(t)
		if err := pk.chainErr(); err != nil && !errors.Is(err, errRead) && !errors.Is(err, errTimedOut) {
			t.Fatalf("wait %d: %v", i, err)
		}
	}
	stopStorm()
	time.Sleep(20 * time.Millisecond) // a second end would show
	outcomes := map[string]int{}
	for i, pk := range pks {
		switch err := pk.chainErr(); {
		case err != nil:
			outcomes[err.Error()]++
		case pk.answered.Load():
			outcomes["answered"]++
		default:
			outcomes["cancelled"]++
		}
		pk.pr.mu.Lock()
		dones, aborts := pk.pr.dones, pk.pr.aborts
		pk.pr.mu.Unlock()
		if dones != 1 || len(aborts) != 0 {
			t.Fatalf("wait %d: %d dones, aborts %v; want one done", i, dones, aborts)
		}
		if v := pk.bad.Load(); v != nil {
			t.Fatalf("wait %d: %v", i, v)
		}
		if to := pk.timeouts.Load(); to > 1 || (to == 1) != errors.Is(pk.chainErr(), errTimedOut) {
			t.Fatalf("wait %d: %d timeouts, error %v", i, to, pk.chainErr())
		}
	}
	if got := ws.Count(); got != 0 {
		t.Fatalf("%d waiters left", got)
	}
	t.Logf("outcomes %v", outcomes)
}
