package httpapi

import (
	"errors"
	"sync"
)

// Parker is implemented by an http.ResponseWriter whose transport can keep a
// request open after its handler's goroutine returned (the framed node
// connection). A handler that calls Park must return p.Err() up its chain and
// later call p.Finish exactly once; between the two it may write to the
// ResponseWriter from one goroutine at a time.
type Parker interface{ Park() *Park }

// Park is a parked request: its handler returned p.Err() instead of
// answering, and something it armed (a wake, a timer) finishes it later.
// The handler's chain registers with Then what it would have done after
// the handler returned (release a slot, write an error); the adapter at
// the chain's top, which consumes the error instead of passing it up
// (hosts.Room.NodeAuthID), calls Returned.
//
// The request ends when both Finish (or a panic in a function started by
// Go) and Returned were called, in either order: the Then chain, then done
// (abort after a panic), run on the goroutine of the later of the two.
// Finish may thus come while the chain is still returning (an event fired
// as the handler parked): the chain waits for its last Then.
//
// Then, Err and Returned run on the handler's goroutine; Finish and Go on
// any. A mutex orders them: Then's appends happen before Returned, and
// Returned before the chain runs, wherever it runs.
type Park struct {
	mu       sync.Mutex
	then     []func(error) error
	done     func()
	abort    func(any)
	onCancel func()
	err      error // Finish's, until the request ends
	panic    any   // a Go function's, until the request ends
	state    parkState
}

// parkState is a Park's progress.
type parkState uint8

const (
	parkReturned  parkState = 1 << iota // Returned was called
	parkFinished                        // Finish was called
	parkEnded                           // the chain (then done) or abort was started
	parkCancelled                       // the transport gave the request up (Cancel)
	parkPanicked                        // a function started by Go panicked
)

// NewPark is for transports: done runs once when the parked request
// finishes (after the Then chain, which may have written an error answer);
// abort runs instead of done when a function started by Go panics, with the
// panic value, after the Then chain ran with a nil error (the transport
// then drops the request, as net/http resets a stream whose handler
// panicked); a Then func that panics aborts too (the rest of the chain does
// not run).
//
// done and abort may run on the handler's goroutine before the transport's
// ServeHTTP returned (the request finished as its chain returned), or on
// another goroutine while ServeHTTP is still returning.
func NewPark(done func(), abort func(p any)) *Park {
	return &Park{done: done, abort: abort}
}

// Cancel is the transport's: the request's client gave it up (cancelled
// it, or went away), as the end of its context says to a handler that
// blocks. It runs OnCancel's func, once, on the caller's goroutine. A
// transport that parks requests calls it for every request it gives up.
func (p *Park) Cancel() {
	p.mu.Lock()
	if p.state&parkCancelled != 0 {
		p.mu.Unlock()
		return
	}
	p.state |= parkCancelled
	f := p.onCancel
	p.onCancel = nil
	p.mu.Unlock()
	if f != nil {
		f()
	}
}

// OnCancel has f run when the transport gives the request up (Cancel), at
// once if it already has: a parked request's stand-in for watching its
// context, which costs a goroutine-free context.AfterFunc a context and a
// map of its own. f must not block.
func (p *Park) OnCancel(f func()) {
	p.mu.Lock()
	if p.state&parkCancelled == 0 {
		p.onCancel = f
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	f()
}

// parkedError is the error of a Park (Err): a conversion, no allocation.
type parkedError Park

func (*parkedError) Error() string { return "request parked" }

// Err is the error a parking handler returns; every middleware between it
// and the transport passes it up unchanged (after registering its
// after-work with Then). IsParked / ParkOf recognise it (also wrapped).
func (p *Park) Err() error { return (*parkedError)(p) }

// IsParked reports whether err is (or wraps) a Park's Err.
func IsParked(err error) bool {
	_, ok := ParkOf(err)
	return ok
}

// ParkOf is the Park whose Err err is or wraps.
func ParkOf(err error) (*Park, bool) {
	if err == nil {
		return nil, false
	}
	pe, ok := err.(*parkedError) //nolint:errorlint // the unwrapped error, without errors.As's allocation
	if !ok && !errors.As(err, &pe) {
		return nil, false
	}
	return (*Park)(pe), true
}

// Then adds f, to run when the request finishes with the handler's final
// error; f returns the error passed to the next f. They run in the order
// added (the innermost middleware adds first, as a stack unwinds).
func (p *Park) Then(f func(error) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state&parkReturned != 0 {
		panic("httpapi: Park.Then after Returned")
	}
	if p.then == nil {
		p.then = make([]func(error) error, 0, 3) // a parked wait's, Limit's and NodeAuthID's
	}
	p.then = append(p.then, f)
}

// Returned marks the handler's chain returned: every Then is registered.
// The adapter at the top of the chain (the one that consumes the error)
// calls it after its own Then; a transport may call it as well once its
// ServeHTTP returned (a second call does nothing). When Finish (or a
// panic) came first, the request ends here, on the caller's goroutine.
func (p *Park) Returned() {
	p.mu.Lock()
	if p.state&parkReturned != 0 {
		p.mu.Unlock()
		return
	}
	p.state |= parkReturned
	p.endLocked()
}

// Go runs fn on a new goroutine. A panic in fn is recovered and ends the
// request through abort, after the Then chain ran with a nil error (as a
// panic unwinds a handler's defers: a slot is released, no error answer
// is written); log nothing here. A panic after the request ended (fn went
// on after its Finish) is not the request's: it is raised again.
func (p *Park) Go(fn func()) { go p.run(fn) }

func (p *Park) run(fn func()) {
	defer p.onPanic()
	fn()
}

// onPanic is run's deferred panic handler.
func (p *Park) onPanic() {
	v := recover()
	if v == nil {
		return
	}
	p.mu.Lock()
	if p.state&(parkEnded|parkPanicked) != 0 {
		p.mu.Unlock()
		panic(v)
	}
	p.state |= parkPanicked
	p.panic = v
	p.endLocked()
}

// Finish ends the parked request with err: the Then chain, then done.
// Called exactly once (a second call panics: it is a bug). Before Returned
// it only records err; Returned then ends the request.
func (p *Park) Finish(err error) {
	p.mu.Lock()
	if p.state&parkFinished != 0 {
		p.mu.Unlock()
		panic("httpapi: Park.Finish called twice")
	}
	p.state |= parkFinished
	p.err = err
	p.endLocked()
}

// endLocked ends the request once it can (the chain returned, and Finish
// or a panic came), with p.mu held, which it releases: a panic's end
// wins over Finish's.
func (p *Park) endLocked() {
	if p.state&parkReturned == 0 || p.state&parkEnded != 0 || p.state&(parkFinished|parkPanicked) == 0 {
		p.mu.Unlock()
		return
	}
	p.state |= parkEnded
	err, v, panicked := p.err, p.panic, p.state&parkPanicked != 0
	p.err, p.panic = nil, nil
	p.mu.Unlock()
	if panicked {
		if p.chain(nil) {
			p.abort(v)
		}
		return
	}
	p.end(err)
}

// end runs the Then chain, then done; a panic in the chain ends the request
// through abort instead (net/http recovers a panic after a handler's next
// returned, too).
func (p *Park) end(err error) {
	if p.chain(err) {
		p.done()
	}
}

// chain runs the Then funcs (ok false: one panicked, and abort ran).
func (p *Park) chain(err error) (ok bool) {
	defer func() {
		if !ok {
			p.abort(recover())
		}
	}()
	for _, f := range p.then {
		err = f(err)
	}
	p.then = nil
	return true
}
