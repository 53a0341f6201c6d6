package server

import (
	"testing"
)

func TestWaitersWakeOnlyTheirNode(t *testing.T) {
	w := newWaiters()
	a, doneA := w.add("a")
	b, doneB := w.add("b")
	if got := w.count(); got != 2 {
		t.Fatalf("count %d, want 2", got)
	}
	w.wake("a")
	w.wake("a") // coalesces; must not block
	select {
	case <-a:
	default:
		t.Fatal("waiter a not woken")
	}
	select {
	case <-b:
		t.Fatal("waiter b woken by a's task")
	default:
	}
	doneA()
	doneB()
	if got := w.count(); got != 0 {
		t.Fatalf("count %d after removal, want 0", got)
	}
	w.wake("a") // no waiters: no-op
}
