// Package parktest runs node long-poll handlers in tests the way both of
// their transports do: blocking, as net/http does, and parked, as the
// framed node connection does (httpapi.Parker), with a transport double
// that gives a parked request up (Park.Cancel) when its request's context
// ends, as the framed connection does.
package parktest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
)

// Mode is how a test's long-polls are served.
type Mode int

const (
	Blocking Mode = iota // as net/http does: the handler returns with the answer
	Parked               // by a transport that parks requests (the framed node connection)
)

// Modes is both modes, for a test to run in each.
func Modes() []Mode { return []Mode{Blocking, Parked} }

// String is the mode's name, for a subtest.
func (m Mode) String() string {
	if m == Parked {
		return "parked"
	}
	return "blocking"
}

// Recorder is a ResponseRecorder that notes whether anything was written.
type Recorder struct {
	*httptest.ResponseRecorder
	Wrote bool
}

func (w *Recorder) WriteHeader(code int) { w.Wrote = true; w.ResponseRecorder.WriteHeader(code) }

func (w *Recorder) Write(b []byte) (int, error) { w.Wrote = true; return w.ResponseRecorder.Write(b) }

// parker is a Recorder of a transport that parks requests: done is closed
// when the parked request ends (ends counts how often it did). As the
// framed connection does, it gives a parked request up (Park.Cancel) when
// the request's context ends.
type parker struct {
	*Recorder
	ctx     context.Context
	done    chan struct{}
	ends    atomic.Int32
	aborted atomic.Value
}

func (w *parker) Park() *httpapi.Park {
	end := func() {
		if w.ends.Add(1) == 1 {
			close(w.done)
		}
	}
	p := httpapi.NewPark(end, func(v any) { w.aborted.Store(fmt.Sprint(v)); end() })
	context.AfterFunc(w.ctx, p.Cancel)
	return p
}

// Pending is a long-poll in flight.
type Pending struct {
	Rec  *Recorder     // its answer, as written so far
	Park *httpapi.Park // the Park its handler returned; nil if it did not park
	pw   *parker       // Parked mode
	err  error         // the handler's, or the parked request's final error
	done chan struct{}
}

// Start runs h for node's req. Parked: on the test's goroutine, which it
// returns to (as the top of the request's chain, it then marks the chain
// returned); Blocking: on a goroutine of its own.
func (m Mode) Start(t testing.TB, h httpapi.NodeHandler, req *http.Request, node string) *Pending {
	t.Helper()
	pd := &Pending{Rec: &Recorder{ResponseRecorder: httptest.NewRecorder()}, done: make(chan struct{})}
	if m != Parked {
		go func() { pd.err = h(pd.Rec, req, node); close(pd.done) }()
		return pd
	}
	pd.pw = &parker{Recorder: pd.Rec, ctx: req.Context(), done: pd.done}
	err := h(pd.pw, req, node)
	p, ok := httpapi.ParkOf(err)
	if !ok {
		pd.err = err
		close(pd.done)
		return pd
	}
	pd.Park = p
	p.Then(func(err error) error { pd.err = err; return nil })
	p.Returned()
	return pd
}

// Ended reports whether the long-poll ended.
func (pd *Pending) Ended() bool {
	select {
	case <-pd.done:
		return true
	default:
		return false
	}
}

// Wait waits for the long-poll's end: its answer and error. It fails the
// test if the long-poll does not end within 5 s or was aborted.
func (pd *Pending) Wait(t testing.TB) (*Recorder, error) {
	t.Helper()
	v, err := pd.WaitAbort(t)
	if v != nil {
		t.Fatalf("the parked request was aborted: %v", v)
	}
	return pd.Rec, err
}

// WaitAbort waits for the long-poll's end, failing the test if it does not
// end within 5 s: the value its parked request was aborted with (as
// fmt.Sprint writes it; nil if it was not) and its error.
func (pd *Pending) WaitAbort(t testing.TB) (v any, err error) {
	t.Helper()
	select {
	case <-pd.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the long-poll did not end")
	}
	if pd.pw != nil {
		v = pd.pw.aborted.Load()
	}
	return v, pd.err
}

// Ends is how often the parked request ended (its done or abort ran), for
// a test that it did once.
func (pd *Pending) Ends() int {
	if pd.pw == nil {
		return 0
	}
	return int(pd.pw.ends.Load())
}

// Eventually fails the test unless cond holds within 5 s.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not so after 5s: %s", what)
		}
	}
}
