package sqlstore

import (
	"context"
	"sync"

	"github.com/drover-dev/drover/internal/cp/store"
)

// SubscriberBuffer is the channel capacity of each subscription. When a
// subscriber falls this far behind, further events are dropped for it until
// it catches up; consumers re-read the store, so a dropped event only delays
// a wake-up that a later event (or the consumer's own timeout) provides.
const SubscriberBuffer = 1024

// Broadcaster fans events out to in-process subscribers. The adapters feed
// it: SQLite after each commit, PostgreSQL from its LISTEN connection.
type Broadcaster struct {
	mu     sync.Mutex
	subs   map[chan store.Event]struct{}
	closed bool
	done   chan struct{}
}

// NewBroadcaster returns an empty broadcaster.
func NewBroadcaster() *Broadcaster {
	return &Broadcaster{subs: make(map[chan store.Event]struct{}), done: make(chan struct{})}
}

// Subscribe returns a channel that receives every event published from now
// on, until ctx ends or the broadcaster is closed; then it is closed.
func (b *Broadcaster) Subscribe(ctx context.Context) <-chan store.Event {
	ch := make(chan store.Event, SubscriberBuffer)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		close(ch)
		return ch
	}
	b.subs[ch] = struct{}{}
	b.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-b.done:
		}
		b.mu.Lock()
		if _, ok := b.subs[ch]; ok {
			delete(b.subs, ch)
			close(ch)
		}
		b.mu.Unlock()
	}()
	return ch
}

// Publish delivers ev to every subscriber without blocking; a subscriber
// whose buffer is full misses it.
func (b *Broadcaster) Publish(ev store.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// Subscribers returns the number of live subscriptions.
func (b *Broadcaster) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// Close closes every subscription; later subscriptions are closed at once.
func (b *Broadcaster) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	close(b.done)
	for ch := range b.subs {
		delete(b.subs, ch)
		close(ch)
	}
}
