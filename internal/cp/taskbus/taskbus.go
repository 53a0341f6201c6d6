// Package taskbus is the control plane's in-process task event bus. The
// task path (claim, result, lease reaper) publishes what happened to a
// task; the consumers that care about a task type (the terminal gateway
// for terminal.open, the allocation state machine for the user tasks)
// subscribe to that type when the server is constructed. The task path
// knows no consumer, so a new task type needs no edit to it.
//
// Delivery is synchronous: Publish calls the subscribers of the event's
// task type one after another, in subscription order, on the publisher's
// goroutine, and returns when they have returned. A subscriber therefore
// sees the event inside the request (or reaper tick) that caused it, before
// that request answers, and must not block for long.
//
// The bus is per replica. An event is published only on the replica that
// made the transition; consumers that must learn of transitions made by
// other replicas read the store (store change events, or polling) as well.
package taskbus

import (
	"context"
	"sync"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Dispatched is published when a node claimed a task, before the task is
// written to it. Task is the claimed task (state dispatched, Attempts
// already counting this delivery).
type Dispatched struct {
	Task store.Task
}

// Finished is published when a task reached a final state on this replica:
// a node's result was recorded (again, if it posted the same result twice)
// or the lease reaper expired the task.
type Finished struct {
	// Task is the task in its final state; Task.Result is the stored
	// result as the node posted it.
	Task store.Task
	// Result is Task.Result decoded; nil when the task ended without a
	// result (expired) or the stored result does not decode.
	Result *api.TaskResult
}

// Handler consumes one kind of event.
type Handler[E any] func(ctx context.Context, e E)

// topic holds the subscribers of one event kind, by task type.
type topic[E any] struct {
	subs map[string][]Handler[E]
}

func (t *topic[E]) add(taskType string, h Handler[E]) {
	if t.subs == nil {
		t.subs = map[string][]Handler[E]{}
	}
	t.subs[taskType] = append(t.subs[taskType], h)
}

// Bus routes task events to the subscribers of their task type. The zero
// value is not usable; call New. Subscriptions are meant to be made while
// the server is constructed, but the bus is safe for concurrent use.
type Bus struct {
	mu         sync.RWMutex
	dispatched topic[Dispatched]
	finished   topic[Finished]
}

// New returns a bus without subscribers.
func New() *Bus { return &Bus{} }

// OnDispatched subscribes h to Dispatched events of taskType.
func (b *Bus) OnDispatched(taskType string, h Handler[Dispatched]) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dispatched.add(taskType, h)
}

// OnFinished subscribes h to Finished events of taskType.
func (b *Bus) OnFinished(taskType string, h Handler[Finished]) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.finished.add(taskType, h)
}

// PublishDispatched delivers e to the Dispatched subscribers of
// e.Task.Type, synchronously and in subscription order.
func (b *Bus) PublishDispatched(ctx context.Context, e Dispatched) {
	for _, h := range subscribersOf(&b.mu, func() []Handler[Dispatched] { return b.dispatched.subs[e.Task.Type] }) {
		h(ctx, e)
	}
}

// PublishFinished delivers e to the Finished subscribers of e.Task.Type,
// synchronously and in subscription order.
func (b *Bus) PublishFinished(ctx context.Context, e Finished) {
	for _, h := range subscribersOf(&b.mu, func() []Handler[Finished] { return b.finished.subs[e.Task.Type] }) {
		h(ctx, e)
	}
}

// subscribersOf reads a subscriber list under the read lock; the handlers
// run without it, so a handler may subscribe or publish.
func subscribersOf[E any](mu *sync.RWMutex, get func() []Handler[E]) []Handler[E] {
	mu.RLock()
	defer mu.RUnlock()
	return get()
}
