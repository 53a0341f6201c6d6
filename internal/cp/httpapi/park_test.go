package httpapi

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// parkProbe records how a Park ended: done, or abort with its value.
type parkProbe struct {
	mu      sync.Mutex
	dones   int
	aborts  []any
	settled chan struct{} // closed at the first end
}

func newParkProbe() (*parkProbe, *Park) {
	pr := &parkProbe{settled: make(chan struct{})}
	return pr, NewPark(func() { pr.end(nil, false) }, func(v any) { pr.end(v, true) })
}

func (pr *parkProbe) end(v any, aborted bool) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if aborted {
		pr.aborts = append(pr.aborts, v)
	} else {
		pr.dones++
	}
	if pr.dones+len(pr.aborts) == 1 {
		close(pr.settled)
	}
}

// wait waits for the Park's end and returns the dones and aborts so far.
func (pr *parkProbe) wait(t *testing.T) (int, []any) {
	t.Helper()
	select {
	case <-pr.settled:
	case <-time.After(5 * time.Second):
		t.Fatal("the parked request never ended")
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.dones, slices.Clone(pr.aborts)
}

// ended reports whether the Park ended (done or abort).
func (pr *parkProbe) ended() bool {
	select {
	case <-pr.settled:
		return true
	default:
		return false
	}
}

// TestParkChain: the Then funcs run in the order added, each passing its
// error to the next, then done, once both Finish and Returned were called,
// in either order, and not before.
func TestParkChain(t *testing.T) {
	errIn, errOut := errors.New("claim failed"), errors.New("rewritten")
	for _, tc := range []struct {
		name          string
		finishFirst   bool // Finish comes while the chain returns
		finishOnGo    bool
		returnedTwice bool
		finishErr     error
		wantErrs      [2]error // what the first and the second Then got
	}{
		{"returned, then finish", false, false, false, errIn, [2]error{errIn, errOut}},
		{"finish as the chain returns", true, false, false, errIn, [2]error{errIn, errOut}},
		{"finish on a goroutine of Go", false, true, false, nil, [2]error{nil, errOut}},
		{"returned twice (top of the chain and transport)", false, false, true, nil, [2]error{nil, errOut}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr, p := newParkProbe()
			var got []error
			var order []string
			p.Then(func(err error) error { got, order = append(got, err), append(order, "inner"); return errOut })
			if tc.finishFirst {
				p.Finish(tc.finishErr)
				if pr.ended() {
					t.Fatal("the request ended before the chain returned")
				}
			}
			p.Then(func(err error) error { got, order = append(got, err), append(order, "outer"); return nil })
			p.Returned()
			if tc.returnedTwice {
				p.Returned()
			}
			if !tc.finishFirst {
				if pr.ended() {
					t.Fatal("the request ended before Finish")
				}
				if tc.finishOnGo {
					p.Go(func() { p.Finish(tc.finishErr) })
				} else {
					p.Finish(tc.finishErr)
				}
			}
			if dones, aborts := pr.wait(t); dones != 1 || len(aborts) != 0 {
				t.Fatalf("%d dones, aborts %v; want one done", dones, aborts)
			}
			if !slices.Equal(order, []string{"inner", "outer"}) || got[0] != tc.wantErrs[0] || got[1] != tc.wantErrs[1] {
				t.Fatalf("chain %v got %v, want inner then outer with %v", order, got, tc.wantErrs)
			}
		})
	}
}

// TestParkFinishTwicePanics: a second Finish is a bug.
func TestParkFinishTwicePanics(t *testing.T) {
	_, p := newParkProbe()
	p.Returned()
	p.Finish(nil)
	defer func() {
		if recover() == nil {
			t.Fatal("a second Finish did not panic")
		}
	}()
	p.Finish(nil)
}

// TestParkGoPanicAborts: a panic in a function started by Go ends the
// request through abort, with the panic's value, after the Then chain ran
// with a nil error (as a panic unwinds a handler's defers): done never
// runs, neither then nor when Finish comes later. A panic before the chain
// returned waits for it. A panic in the Then chain aborts too.
func TestParkGoPanicAborts(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(p *Park) // what the request does, Returned and Then aside
	}{
		{"panic before Finish, chain returned", func(p *Park) {
			p.Returned()
			p.Go(func() { panic("boom") })
		}},
		{"panic before the chain returned", func(p *Park) {
			p.Go(func() { panic("boom") })
			waitPanicked(t, p)
			p.Returned()
			p.Finish(nil)
		}},
		{"panic after a Finish that waits for the chain", func(p *Park) {
			p.Go(func() { p.Finish(nil); panic("boom") })
			waitPanicked(t, p)
			p.Returned()
		}},
		{"panic in the chain", func(p *Park) {
			p.Then(func(error) error { panic("boom") })
			p.Returned()
			p.Go(func() { p.Finish(nil) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr, p := newParkProbe()
			ran := false
			var chainErr error
			p.Then(func(err error) error { ran, chainErr = true, err; return err })
			tc.run(p)
			pr.wait(t)
			time.Sleep(10 * time.Millisecond) // a late done or abort would show
			pr.mu.Lock()
			dones, aborts := pr.dones, pr.aborts
			pr.mu.Unlock()
			if dones != 0 || len(aborts) != 1 || aborts[0] != "boom" {
				t.Fatalf("%d dones, aborts %v; want one abort with the panic's value", dones, aborts)
			}
			if !ran || chainErr != nil {
				t.Fatalf("the Then chain ran %v with %v; want it run with nil before the abort (a slot is released)", ran, chainErr)
			}
		})
	}
}

// waitPanicked waits until a function p started panicked.
func waitPanicked(t *testing.T, p *Park) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		p.mu.Lock()
		panicked := p.state&parkPanicked != 0
		p.mu.Unlock()
		if panicked {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the function did not panic")
		}
	}
}

// TestParkOf: ParkOf and IsParked recognise a Park's Err, also wrapped,
// and nothing else.
func TestParkOf(t *testing.T) {
	_, p := newParkProbe()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"Err", p.Err(), true},
		{"wrapped", fmt.Errorf("poll: %w", p.Err()), true},
		{"joined", errors.Join(errors.New("x"), p.Err()), true},
		{"nil", nil, false},
		{"another error", Errorf(403, "node_identity_revoked", "revoked"), false},
	} {
		got, ok := ParkOf(tc.err)
		if ok != tc.want || IsParked(tc.err) != tc.want || (ok && got != p) {
			t.Errorf("%s: ParkOf %v %v, IsParked %v; want %v", tc.name, got, ok, IsParked(tc.err), tc.want)
		}
	}
}

// TestParkCancel: the transport's Cancel runs OnCancel's func once,
// whichever comes first; a Park never cancelled never runs it.
func TestParkCancel(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(p *Park, f func())
		want int
	}{
		{"registered, then cancelled", func(p *Park, f func()) { p.OnCancel(f); p.Cancel() }, 1},
		{"cancelled, then registered", func(p *Park, f func()) { p.Cancel(); p.OnCancel(f) }, 1},
		{"cancelled twice", func(p *Park, f func()) { p.OnCancel(f); p.Cancel(); p.Cancel() }, 1},
		{"never cancelled", func(p *Park, f func()) { p.OnCancel(f); p.Finish(nil) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, p := newParkProbe()
			n := 0
			tc.run(p, func() { n++ })
			if n != tc.want {
				t.Fatalf("OnCancel's func ran %d times, want %d", n, tc.want)
			}
		})
	}
}
