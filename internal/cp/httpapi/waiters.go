package httpapi

import "sync"

// Waiters wakes the long-polls of a node when what they wait for (a
// claimable task, a changed desired instance set) may have changed. A wake
// is a hint: the woken poll re-reads.
type Waiters struct {
	mu    sync.Mutex
	nodes map[string]map[chan struct{}]struct{}
}

// NewWaiters is an empty set of waiters.
func NewWaiters() *Waiters { return &Waiters{nodes: make(map[string]map[chan struct{}]struct{})} }

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

// Wake signals every waiter of node without blocking.
func (w *Waiters) Wake(node string) {
	w.mu.Lock()
	for ch := range w.nodes[node] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	w.mu.Unlock()
}

// WakeAll signals every waiter of every node (events may have been lost).
func (w *Waiters) WakeAll() {
	w.mu.Lock()
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
