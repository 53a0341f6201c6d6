package httpapi

import "sync"

// Waiters wakes the long-polls of a node when what they wait for (a
// claimable task, a changed desired instance set) may have changed. A wake
// is a hint: the woken poll re-reads.
//
// It also remembers which nodes are quiet: their last wait ended on a read
// that found nothing (Settle, SettleUnless) and no wake for them came
// since, so a new wait may park without reading again. Every wake of the
// node (even with no waiter parked) and WakeAll end a node's quiet.
//
// A waiter is a channel (Add: a poll whose goroutine blocks on it) or a
// callback (AddFunc: a parked poll, which holds no goroutine). Wake and
// WakeAll call the callbacks, and SettleUnless its pending, with Waiters'
// mutex held: they must not block nor call back into Waiters. A lock they
// take (the poll's own) comes after Waiters' mutex: never call Waiters
// while holding it.
type Waiters struct {
	mu    sync.Mutex
	nodes map[string]map[chan struct{}]struct{}
	funcs map[string]*funcWaiter // the first of each node's callback waiters
	nfunc int                    // callback waiters, over all nodes
	quiet map[string]struct{}
}

// funcWaiter is a callback waiter (AddFunc), in a list per node: no map
// or channel per parked poll.
type funcWaiter struct {
	w          *Waiters
	node       string
	wake       func() // nil once removed
	prev, next *funcWaiter
}

// NewWaiters is an empty set of waiters.
func NewWaiters() *Waiters {
	return &Waiters{nodes: make(map[string]map[chan struct{}]struct{}), funcs: make(map[string]*funcWaiter),
		quiet: make(map[string]struct{})}
}

// Quiet reports whether node is quiet. A wait asks after Add (AddFunc), so
// a wake that ends the quiet is then either seen here or pending on its
// channel (its callback was called).
func (w *Waiters) Quiet(node string) bool {
	w.mu.Lock()
	_, ok := w.quiet[node]
	w.mu.Unlock()
	return ok
}

// Settle marks node quiet for a wait on ch whose last read, made after any
// wake it took from ch, found nothing; a wake still pending on ch means
// something may have changed since, and leaves node as it is.
func (w *Waiters) Settle(node string, ch <-chan struct{}) {
	w.mu.Lock()
	if len(ch) == 0 {
		w.quiet[node] = struct{}{}
	}
	w.mu.Unlock()
}

// SettleUnless is Settle for a callback waiter: it marks node quiet unless
// pending reports a wake that the wait's last read did not follow. pending
// runs with Waiters' mutex held, so no wake comes between its answer and
// the mark.
func (w *Waiters) SettleUnless(node string, pending func() bool) {
	w.mu.Lock()
	if !pending() {
		w.quiet[node] = struct{}{}
	}
	w.mu.Unlock()
}

// QuietCount is the number of quiet nodes.
func (w *Waiters) QuietCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.quiet)
}

// Add registers a wake channel for node; call the returned func to remove it.
func (w *Waiters) Add(node string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	set := w.nodes[node]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		w.nodes[node] = set
	}
	set[ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		delete(set, ch)
		if len(set) == 0 && w.nodes[node] != nil && len(w.nodes[node]) == 0 {
			delete(w.nodes, node)
		}
		w.mu.Unlock()
	}
}

// AddFunc registers a callback waiter for node: wake is called (with
// Waiters' mutex held: it must not block nor call into Waiters) on each
// wake of node. Call the returned func to remove it; a second call does
// nothing.
func (w *Waiters) AddFunc(node string, wake func()) (remove func()) {
	return w.addFunc(node, wake).remove
}

// addFunc is AddFunc, returning the waiter itself (a ParkedWait keeps it
// rather than a remove closure).
func (w *Waiters) addFunc(node string, wake func()) *funcWaiter {
	fw := &funcWaiter{w: w, node: node, wake: wake}
	w.mu.Lock()
	if head := w.funcs[node]; head != nil {
		fw.next, head.prev = head, fw
	}
	w.funcs[node] = fw
	w.nfunc++
	w.mu.Unlock()
	return fw
}

func (fw *funcWaiter) remove() {
	w := fw.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if fw.wake == nil {
		return
	}
	switch {
	case fw.prev != nil:
		fw.prev.next = fw.next
	case fw.next != nil:
		w.funcs[fw.node] = fw.next
	default:
		delete(w.funcs, fw.node)
	}
	if fw.next != nil {
		fw.next.prev = fw.prev
	}
	fw.wake, fw.prev, fw.next = nil, nil, nil
	w.nfunc--
}

// Wake signals every waiter of node without blocking, and ends its quiet.
func (w *Waiters) Wake(node string) {
	w.mu.Lock()
	delete(w.quiet, node)
	for ch := range w.nodes[node] {
		signal(ch)
	}
	for fw := w.funcs[node]; fw != nil; fw = fw.next {
		fw.wake()
	}
	w.mu.Unlock()
}

// WakeAll signals every waiter of every node and ends every quiet (events
// may have been lost).
func (w *Waiters) WakeAll() {
	w.mu.Lock()
	clear(w.quiet)
	for _, set := range w.nodes {
		for ch := range set {
			signal(ch)
		}
	}
	for _, fw := range w.funcs {
		for ; fw != nil; fw = fw.next {
			fw.wake()
		}
	}
	w.mu.Unlock()
}

// signal leaves a wake on ch unless one is pending already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Count is the number of open long-polls (for metrics).
func (w *Waiters) Count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nfunc
	for _, set := range w.nodes {
		n += len(set)
	}
	return n
}
