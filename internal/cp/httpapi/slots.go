package httpapi

import "sync"

// Slots caps how many requests each key (a node) has in flight at once,
// e.g. the long-polls of one route.
type Slots struct {
	mu    sync.Mutex
	limit int
	held  map[string]int
	total int
}

// NewSlots allows limit requests per key.
func NewSlots(limit int) *Slots {
	return &Slots{limit: limit, held: map[string]int{}}
}

// Acquire takes a slot for node; ok is false when it holds limit already.
// release gives the slot back.
func (n *Slots) Acquire(node string) (release func(), ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.held[node] >= n.limit {
		return nil, false
	}
	n.held[node]++
	n.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.held[node]--; n.held[node] == 0 {
				delete(n.held, node)
			}
			n.total--
		})
	}, true
}

// Count is the number of slots held over all keys.
func (n *Slots) Count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.total
}

// Limit is the number of slots per key.
func (n *Slots) Limit() int { return n.limit }
