package httpapi

import (
	"testing"
)

func TestWaitersWakeOnlyTheirNode(t *testing.T) {
	w := NewWaiters()
	a, doneA := w.Add("a")
	b, doneB := w.Add("b")
	if got := w.Count(); got != 2 {
		t.Fatalf("count %d, want 2", got)
	}
	w.Wake("a")
	w.Wake("a") // coalesces; must not block
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
	if got := w.Count(); got != 0 {
		t.Fatalf("count %d after removal, want 0", got)
	}
	w.Wake("a") // no waiters: no-op
}

func TestWaitersWakeAll(t *testing.T) {
	w := NewWaiters()
	a, doneA := w.Add("a")
	b, doneB := w.Add("b")
	defer doneA()
	defer doneB()
	w.WakeAll()
	w.WakeAll() // coalesces; must not block
	for name, ch := range map[string]<-chan struct{}{"a": a, "b": b} {
		select {
		case <-ch:
		default:
			t.Fatalf("waiter %s not woken", name)
		}
	}
}
