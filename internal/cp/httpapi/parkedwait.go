package httpapi

import (
	"net/http"
	"sync"
	"time"
)

// ParkedWait is a long-poll parked on a transport that holds requests
// (Parker): the event machinery the long-poll routes share. Its events
// are a wake of its node (a Waiters callback), its timer and its
// request's end (Park.Cancel); they run the route's part (ParkedRoute) on
// a goroutine started for them (Park.Go), so that the wait holds no
// goroutine in between.
//
// A route embeds it in its poll (one allocation per wait) and, on the
// handler's goroutine: Start before its first read (a change committed
// during the read still wakes it), then either Stop (the read answered
// or failed: it does not park) or Park, whose error the handler returns.
//
// Each event sets its flag under mu and, unless a goroutine runs the wait
// already (waitRunning), starts one; a running one reads the flags before
// it stops, under the same lock, so no event is lost between its last look
// and its stop. The handler's goroutine holds waitRunning from Start until
// Park armed the wait.
//
// Lock order: Waiters' mutex, then mu (the wake callback and WakePending
// run under Waiters'). Nothing calls Waiters while holding mu.
type ParkedWait struct {
	route  ParkedRoute
	park   *Park
	timer  *time.Timer
	waiter *funcWaiter // not its remove method value: no closure per wait
	mu     sync.Mutex
	state  waitState
}

// ParkedRoute is a route's part of a ParkedWait. Its methods run on the
// goroutine the wait's events started, one at a time; they may write to
// the request's ResponseWriter. A panic in one aborts the request (Park.Go)
// and still disarms the wait.
type ParkedRoute interface {
	// Woken re-reads after a wake of the node. done: it answered; a
	// non-nil err finishes the request too (its chain answers the error).
	// Otherwise the wait goes on.
	Woken() (done bool, err error)
	// TimedOut answers a wait whose time is up, and returns the
	// request's error (nil once it answered).
	TimedOut() error
}

// waitState is what a ParkedWait has pending, and whether a goroutine
// runs it.
type waitState uint8

const (
	waitWoken     waitState = 1 << iota // a wake came since the route's last read
	waitTimedOut                        // the wait's time is up
	waitCancelled                       // the transport gave the request up
	waitRunning                         // a goroutine runs the wait (until it ends, for good)

	waitEvents = waitWoken | waitTimedOut | waitCancelled
)

// Start registers the wait's waiter for node with ws; route is the poll
// that embeds pw. Call it before the route's first read, on the handler's
// goroutine, which runs the wait until Stop or Park: a wake that comes
// meanwhile is kept for Park.
func (pw *ParkedWait) Start(route ParkedRoute, ws *Waiters, node string) {
	pw.route = route
	pw.state = waitRunning
	pw.waiter = ws.addFunc(node, pw.woken)
}

// Node is the node the wait waits for (Start's): the routes read it here
// rather than keep a copy.
func (pw *ParkedWait) Node() string { return pw.waiter.node }

// Stop removes the waiter of a wait that does not park: its first read
// answered or failed.
func (pw *ParkedWait) Stop() { pw.waiter.remove() }

// Park parks w's request (w must be a Parker) for at most wait and returns
// the error the handler returns up its chain. The route's methods then
// answer it on the wait's events; its waiter and timer go when the request
// ends (disarm, the first step of its chain).
func (pw *ParkedWait) Park(w http.ResponseWriter, wait time.Duration) error {
	p := w.(Parker).Park()
	pw.park = p
	p.Then(pw.disarm) // first in the chain, also when the route panics
	pw.timer = time.AfterFunc(wait, pw.timedOut)
	p.OnCancel(pw.cancelled) // the request's context ends then too
	pw.hand()
	return p.Err()
}

// WakePending reports whether a wake came since the route's last read. A
// route's TimedOut passes it to Waiters.SettleUnless, which calls it with
// Waiters' mutex held.
func (pw *ParkedWait) WakePending() bool {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return pw.state&waitWoken != 0
}

// woken, timedOut and cancelled are the wait's callbacks.
func (pw *ParkedWait) woken()     { pw.fire(waitWoken) }
func (pw *ParkedWait) timedOut()  { pw.fire(waitTimedOut) }
func (pw *ParkedWait) cancelled() { pw.fire(waitCancelled) }

// fire records ev and starts the wait's goroutine unless one runs it.
func (pw *ParkedWait) fire(ev waitState) {
	pw.mu.Lock()
	idle := pw.state&waitRunning == 0
	pw.state |= ev | waitRunning
	pw.mu.Unlock()
	if idle {
		pw.park.Go(pw.run)
	}
}

// hand gives the armed wait over to its events: the handler's goroutine
// stops running it, or, when an event fired while it was armed, starts
// the goroutine that event did not.
func (pw *ParkedWait) hand() {
	pw.mu.Lock()
	if pw.state&waitEvents == 0 {
		pw.state &^= waitRunning
		pw.mu.Unlock()
		return
	}
	pw.mu.Unlock()
	pw.park.Go(pw.run)
}

// run handles the wait's pending events until it finishes the request or
// nothing is pending, as a blocking long-poll's select would: the
// request's end first (no answer), then a wake (whose read may answer),
// then the timeout. Finishing, it leaves waitRunning set: no later event
// starts another goroutine.
func (pw *ParkedWait) run() {
	for {
		pw.mu.Lock()
		st := pw.state
		switch {
		case st&waitCancelled != 0:
			pw.mu.Unlock()
			pw.park.Finish(nil) // the transport answers nothing to a request cancelled
			return
		case st&waitWoken != 0:
			pw.state &^= waitWoken
			pw.mu.Unlock()
			if done, err := pw.route.Woken(); done || err != nil {
				pw.park.Finish(err)
				return
			}
		case st&waitTimedOut != 0:
			pw.mu.Unlock()
			pw.park.Finish(pw.route.TimedOut())
			return
		default:
			pw.state &^= waitRunning
			pw.mu.Unlock()
			return
		}
	}
}

// disarm stops the wait's timer and removes its waiter: the first step of
// its request's chain, which runs when the request ends, whether it
// finished or the route panicked.
func (pw *ParkedWait) disarm(err error) error {
	pw.timer.Stop()
	pw.waiter.remove()
	return err
}
