package terminal

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// Size is a terminal size in character cells.
type Size struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Bounds applied by Clamp.
const (
	MaxCols = 1000
	MaxRows = 500
)

// String formats s as asciicast does, "COLSxROWS".
func (s Size) String() string { return fmt.Sprintf("%dx%d", s.Cols, s.Rows) }

// Clamp bounds s to 1..MaxCols columns and 1..MaxRows rows. A zero
// dimension is an error (wrapping ErrProtocol), not clamped to 1: it means
// the browser measured a hidden element, and resizing the PTY to it would
// garble the session.
func Clamp(s Size) (Size, error) {
	if s.Cols == 0 || s.Rows == 0 {
		return Size{}, fmt.Errorf("%w: zero terminal size %s", ErrProtocol, s)
	}
	s.Cols = min(s.Cols, MaxCols)
	s.Rows = min(s.Rows, MaxRows)
	return s, nil
}

// EncodeResize returns the JSON payload of a ChanResize frame.
func EncodeResize(s Size) []byte {
	b, _ := json.Marshal(s) // a struct of two integers cannot fail
	return b
}

// DecodeResize parses the payload of a ChanResize frame and clamps it.
// Errors wrap ErrProtocol.
func DecodeResize(payload []byte) (Size, error) {
	var s Size
	if err := json.Unmarshal(payload, &s); err != nil {
		return Size{}, fmt.Errorf("%w: resize message: %w", ErrProtocol, err)
	}
	return Clamp(s)
}

// DebouncerOptions configures a Debouncer. Zero values use the real clock.
type DebouncerOptions struct {
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
	// AfterFunc runs f after d and returns a function that cancels it,
	// reporting whether it stopped f from running; time.AfterFunc when nil.
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
}

// Debouncer coalesces resize events: it holds the latest size and delivers
// at most one per interval, always ending on the latest size (a trailing
// delivery follows a burst). While held (see Hold) it delivers nothing and
// keeps only the latest size, which Flush or the end of the hold delivers.
// The gateway holds until pty_ready, then calls Hold(false).
//
// deliver is called from Set, Hold, Flush or a timer goroutine, never
// concurrently with itself and in order; it must not call back into the
// Debouncer. Methods are safe for concurrent use.
type Debouncer struct {
	interval  time.Duration
	deliver   func(Size)
	now       func() time.Time
	afterFunc func(time.Duration, func()) func() bool

	deliverMu sync.Mutex // serialises deliver; taken while mu is held
	mu        sync.Mutex
	held      bool
	pending   Size
	has       bool        // pending is set
	last      time.Time   // time of the last delivery
	delivered bool        // last is set
	stop      func() bool // cancels the scheduled timer; nil when none
	gen       uint64      // identifies the scheduled timer; a stale one does nothing
	stopped   bool
}

// NewDebouncer returns a Debouncer that delivers at most one size per
// interval to deliver. It starts unheld.
func NewDebouncer(interval time.Duration, deliver func(Size), opts DebouncerOptions) *Debouncer {
	d := &Debouncer{interval: interval, deliver: deliver, now: opts.Now, afterFunc: opts.AfterFunc}
	if d.now == nil {
		d.now = time.Now
	}
	if d.afterFunc == nil {
		d.afterFunc = func(dur time.Duration, f func()) func() bool { return time.AfterFunc(dur, f).Stop }
	}
	return d
}

// Set records s as the latest size and delivers it now if the interval since
// the last delivery has passed, else schedules a trailing delivery.
func (d *Debouncer) Set(s Size) {
	d.mu.Lock()
	d.pending, d.has = s, true
	d.kickLocked()
}

// Hold stops deliveries (true) or resumes them (false). Resuming delivers a
// pending size as Set would.
func (d *Debouncer) Hold(held bool) {
	d.mu.Lock()
	d.held = held
	if held {
		d.cancelLocked()
	}
	d.kickLocked()
}

// Flush delivers the pending size now, ignoring the interval; used when the
// PTY becomes ready. It does nothing while held or with nothing pending.
func (d *Debouncer) Flush() {
	d.mu.Lock()
	if d.held || !d.has || d.stopped {
		d.mu.Unlock()
		return
	}
	d.cancelLocked()
	d.deliverLocked()
}

// Stop cancels a scheduled delivery and drops the pending size; later calls
// deliver nothing.
func (d *Debouncer) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	d.has = false
	d.cancelLocked()
}

// kickLocked delivers or schedules the pending size. It is called with mu
// held and releases it.
func (d *Debouncer) kickLocked() {
	if d.held || !d.has || d.stopped || d.stop != nil {
		d.mu.Unlock()
		return
	}
	if wait := d.interval - d.now().Sub(d.last); d.delivered && wait > 0 {
		d.gen++
		gen := d.gen
		d.stop = d.afterFunc(wait, func() { d.fire(gen) })
		d.mu.Unlock()
		return
	}
	d.deliverLocked()
}

// fire is the callback of timer gen; a timer cancelled too late to stop it
// finds a newer generation and does nothing.
func (d *Debouncer) fire(gen uint64) {
	d.mu.Lock()
	if gen != d.gen || d.stop == nil {
		d.mu.Unlock()
		return
	}
	d.stop = nil
	d.kickLocked()
}

// deliverLocked takes the pending size, marks the delivery time and calls
// deliver. Called with mu held; releases it before calling deliver but after
// taking deliverMu, so deliveries keep the order of their decisions.
func (d *Debouncer) deliverLocked() {
	s := d.pending
	d.has = false
	d.last, d.delivered = d.now(), true
	d.deliverMu.Lock()
	d.mu.Unlock()
	defer d.deliverMu.Unlock()
	d.deliver(s)
}

func (d *Debouncer) cancelLocked() {
	if d.stop != nil {
		d.stop()
		d.stop = nil
		d.gen++
	}
}
