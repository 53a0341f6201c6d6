package tasks

import (
	"net/http"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

// waitParked is Wait on a transport that parks requests. Its waiter is a
// callback (Waiters.AddFunc) and its first claim runs on the handler's
// goroutine, as Wait's; then the request parks and the handler returns.
// The poll holds no goroutine until its wake, its timer or its request's
// end fires and starts one (poll.run), which claims and answers as Wait's
// select does.
//
//go:noinline
func (s *Room) waitParked(w http.ResponseWriter, r *http.Request, nodeID string) error {
	wait, max, err := s.waitParams(r)
	if err != nil {
		return err
	}
	pl := &poll{s: s, w: w, r: r, node: nodeID, max: uint8(max), state: pollRunning}
	pl.remove = s.waiters.AddFunc(nodeID, pl.woken)
	if delivered, err := s.firstClaim(w, r, nodeID, max); delivered || err != nil {
		pl.remove()
		return err
	}
	p := w.(httpapi.Parker).Park()
	pl.park = p
	p.Then(pl.disarm) // first in the chain, also when a claim panics
	pl.arm(wait)
	pl.hand()
	return p.Err()
}

// poll is a parked wait: all it keeps while it waits, besides the request
// and the callbacks armed for it.
//
// Each event (wake, timeout, the request's end) sets its flag under mu and,
// unless a goroutine runs the poll already (pollRunning), starts one
// (Park.Go); a running one reads the flags before it stops, under the same
// lock, so no event is lost between its last look and its stop. The
// handler's goroutine holds pollRunning until the poll is armed (hand).
//
// Lock order: Waiters' mutex, then mu (the wake callback and wakePending
// run under Waiters'). Nothing calls Waiters while holding mu.
type poll struct {
	s      *Room
	w      http.ResponseWriter
	r      *http.Request
	node   string
	park   *httpapi.Park
	timer  *time.Timer
	remove func() // removes the waiter
	mu     sync.Mutex
	state  pollState
	max    uint8 // at most api.MaxClaim
}

const _ = uint8(api.MaxClaim) // poll.max holds it

// pollState is what a poll has pending, and whether a goroutine runs it.
type pollState uint8

const (
	pollWoken     pollState = 1 << iota // a wake came since the last claim
	pollTimedOut                        // the wait's time is up
	pollCancelled                       // the transport gave the request up
	pollRunning                         // a goroutine runs the poll (until it ends, for good)

	pollEvents = pollWoken | pollTimedOut | pollCancelled
)

// woken, timedOut and cancelled are the poll's callbacks.
func (pl *poll) woken()     { pl.fire(pollWoken) }
func (pl *poll) timedOut()  { pl.fire(pollTimedOut) }
func (pl *poll) cancelled() { pl.fire(pollCancelled) }

// fire records ev and starts the poll's goroutine unless one runs it.
func (pl *poll) fire(ev pollState) {
	pl.mu.Lock()
	idle := pl.state&pollRunning == 0
	pl.state |= ev | pollRunning
	pl.mu.Unlock()
	if idle {
		pl.park.Go(pl.run)
	}
}

// arm starts the poll's timer and watches for its request's end (the
// transport's Cancel: the request's context ends then too).
func (pl *poll) arm(wait time.Duration) {
	pl.timer = time.AfterFunc(wait, pl.timedOut)
	pl.park.OnCancel(pl.cancelled)
}

// hand gives the armed poll over to its events: the handler's goroutine
// stops running it, or, when an event fired while it armed the poll,
// starts the goroutine that event did not.
func (pl *poll) hand() {
	pl.mu.Lock()
	if pl.state&pollEvents == 0 {
		pl.state &^= pollRunning
		pl.mu.Unlock()
		return
	}
	pl.mu.Unlock()
	pl.park.Go(pl.run)
}

// run handles the poll's pending events, as Wait's select does, until it
// finishes the request or nothing is pending. An end comes first, then a
// wake (whose claim may deliver), then the timeout.
func (pl *poll) run() {
	for {
		pl.mu.Lock()
		st := pl.state
		switch {
		case st&pollCancelled != 0:
			pl.mu.Unlock()
			pl.finish(nil) // the transport answers nothing to a request cancelled
			return
		case st&pollWoken != 0:
			pl.state &^= pollWoken
			pl.mu.Unlock()
			if delivered, err := pl.s.claimOnWake(pl.w, pl.r, pl.node, int(pl.max)); delivered || err != nil {
				pl.finish(err)
				return
			}
		case st&pollTimedOut != 0:
			pl.mu.Unlock()
			pl.timeout()
			return
		default:
			pl.state &^= pollRunning
			pl.mu.Unlock()
			return
		}
	}
}

// timeout answers a poll whose time is up and no wake is pending for: 204,
// and its node is quiet unless a wake came since (while it looked).
func (pl *poll) timeout() {
	pl.s.waiters.SettleUnless(pl.node, pl.wakePending)
	pl.w.WriteHeader(http.StatusNoContent)
	pl.finish(nil)
}

// wakePending reports whether a wake came since the poll's last claim
// (SettleUnless calls it with Waiters' mutex held).
func (pl *poll) wakePending() bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.state&pollWoken != 0
}

// finish finishes the poll's request with err (the chain disarms it).
// Only the goroutine running the poll calls it, once: pollRunning stays
// set, so no event starts another.
func (pl *poll) finish(err error) { pl.park.Finish(err) }

// disarm stops the poll's timer and removes its waiter: the first step of
// its request's chain, which runs when the request ends, whether it
// finished or a claim panicked.
func (pl *poll) disarm(err error) error {
	pl.timer.Stop()
	pl.remove()
	return err
}
