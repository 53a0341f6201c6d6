package server

import "sync"

// waiters wakes the long-polls of a node when a task may be claimable for
// it. A wake is a hint: the woken poll re-runs its claim.
type waiters struct {
	mu    sync.Mutex
	nodes map[string]map[chan struct{}]struct{}
}

func newWaiters() *waiters { return &waiters{nodes: make(map[string]map[chan struct{}]struct{})} }

// add registers a wake channel for node; call the returned func to remove it.
func (w *waiters) add(node string) (<-chan struct{}, func()) {
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

// wake signals every waiter of node without blocking.
func (w *waiters) wake(node string) {
	w.mu.Lock()
	for ch := range w.nodes[node] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	w.mu.Unlock()
}

// count is the number of open long-polls (for metrics).
func (w *waiters) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, set := range w.nodes {
		n += len(set)
	}
	return n
}
