package httpapi

import "sync"

// Waiters wakes the long-polls of a node when what they wait for (a
// claimable task, a changed desired instance set) may have changed. A wake
// is a hint: the woken poll re-reads.
//
// It also remembers which nodes are quiet: their last wait ended on a read
// that found nothing (Settle) and no wake for them came since, so a new
// wait may park without reading again. Every wake of the node (even with
// no waiter parked) and WakeAll end a node's quiet.
type Waiters struct {
	mu    sync.Mutex
	nodes map[string]map[chan struct{}]struct{}
	quiet map[string]struct{}
}

// NewWaiters is an empty set of waiters.
func NewWaiters() *Waiters {
	return &Waiters{nodes: make(map[string]map[chan struct{}]struct{}), quiet: make(map[string]struct{})}
}

// Quiet reports whether node is quiet. A wait asks after Add, so a wake
// that ends the quiet is then either seen here or pending on its channel.
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

// Wake signals every waiter of node without blocking, and ends its quiet.
func (w *Waiters) Wake(node string) {
	w.mu.Lock()
	delete(w.quiet, node)
	for ch := range w.nodes[node] {
		select {
		case ch <- struct{}{}:
		default:
		}
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
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	w.mu.Unlock()
}

// Count is the number of open long-polls (for metrics).
func (w *Waiters) Count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, set := range w.nodes {
		n += len(set)
	}
	return n
}
