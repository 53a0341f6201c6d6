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

// TestWaitersQuiet: Settle marks a node quiet unless a wake is pending on
// the settling wait's channel; any wake of the node, with or without a
// waiter parked, and WakeAll end it.
func TestWaitersQuiet(t *testing.T) {
	w := NewWaiters()
	ch, done := w.Add("a")
	if w.Quiet("a") {
		t.Fatal("quiet before any settle")
	}
	w.Settle("a", ch)
	done()
	if !w.Quiet("a") || w.Quiet("b") || w.QuietCount() != 1 {
		t.Fatalf("after settle: a %v, b %v, count %d", w.Quiet("a"), w.Quiet("b"), w.QuietCount())
	}
	w.Wake("a") // no waiter parked: still ends the quiet
	if w.Quiet("a") {
		t.Fatal("quiet after a wake")
	}

	ch, done = w.Add("a")
	w.Wake("a") // arrives after the wait's last read, before it settles
	w.Settle("a", ch)
	done()
	if w.Quiet("a") {
		t.Fatal("settled quiet with a wake pending")
	}

	for _, n := range []string{"a", "b"} {
		ch, done := w.Add(n)
		w.Settle(n, ch)
		done()
	}
	w.WakeAll()
	if w.Quiet("a") || w.Quiet("b") || w.QuietCount() != 0 {
		t.Fatal("quiet after WakeAll")
	}
}
