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

// TestWaitersFuncs: a callback waiter is called on each wake of its node
// and on WakeAll, never for another node, and no more once removed
// (whichever of its node's list it is); Count counts both kinds.
func TestWaitersFuncs(t *testing.T) {
	w := NewWaiters()
	calls := map[string]int{}
	add := func(name, node string) func() {
		return w.AddFunc(node, func() { calls[name]++ })
	}
	removeA1, removeA2, removeA3 := add("a1", "a"), add("a2", "a"), add("a3", "a")
	removeB := add("b", "b")
	_, removeCh := w.Add("a")
	check := func(step string, count int, want map[string]int) {
		t.Helper()
		if got := w.Count(); got != count {
			t.Fatalf("%s: count %d, want %d", step, got, count)
		}
		for name, n := range want {
			if calls[name] != n {
				t.Fatalf("%s: %s called %d times, want %d (%v)", step, name, calls[name], n, calls)
			}
		}
	}
	check("added", 5, map[string]int{"a1": 0, "a2": 0, "a3": 0, "b": 0})
	w.Wake("a")
	w.Wake("a") // a callback is called on every wake: the poll coalesces
	check("woken twice", 5, map[string]int{"a1": 2, "a2": 2, "a3": 2, "b": 0})
	w.WakeAll()
	check("WakeAll", 5, map[string]int{"a1": 3, "a2": 3, "a3": 3, "b": 1})
	for _, tc := range []struct {
		name   string
		remove func()
		count  int
		want   map[string]int
	}{
		{"middle removed", removeA2, 4, map[string]int{"a1": 4, "a2": 3, "a3": 4}},
		{"again: nothing", removeA2, 4, map[string]int{"a1": 5, "a2": 3, "a3": 5}},
		{"first added (last in the list) removed", removeA1, 3, map[string]int{"a1": 5, "a2": 3, "a3": 6}},
		{"last added (head) removed", removeA3, 2, map[string]int{"a1": 5, "a2": 3, "a3": 6}},
		{"channel removed", removeCh, 1, map[string]int{"a1": 5, "a2": 3, "a3": 6, "b": 1}},
	} {
		tc.remove()
		w.Wake("a")
		check(tc.name, tc.count, tc.want)
	}
	removeB()
	w.WakeAll()
	check("all removed", 0, map[string]int{"b": 1})
	if len(w.funcs) != 0 || len(w.nodes) != 0 {
		t.Fatalf("nodes left: %d callback lists, %d channel sets", len(w.funcs), len(w.nodes))
	}
	removeA1 = add("a1", "a") // a node's list starts again
	w.Wake("a")
	removeA1()
	check("re-added", 0, map[string]int{"a1": 6})
}

// TestWaitersSettleUnless: SettleUnless marks a node quiet unless its
// pending (asked with Waiters' mutex held) reports a wake; wakes end the
// quiet as for Settle.
func TestWaitersSettleUnless(t *testing.T) {
	w := NewWaiters()
	var woken bool // the poll's flag; here under Waiters' mutex alone
	remove := w.AddFunc("a", func() { woken = true })
	defer remove()
	pending := func() bool {
		if w.mu.TryLock() {
			w.mu.Unlock()
			t.Fatal("pending called without Waiters' mutex held")
		}
		return woken
	}
	w.SettleUnless("a", pending)
	if !w.Quiet("a") {
		t.Fatal("not quiet after a settle with no wake pending")
	}
	w.Wake("a")
	if w.Quiet("a") || !woken {
		t.Fatal("a wake did not end the quiet or reach the waiter")
	}
	w.SettleUnless("a", pending) // the wake came after the wait's last read
	if w.Quiet("a") {
		t.Fatal("settled quiet with a wake pending")
	}
	woken = false // the poll read again, after the wake
	w.SettleUnless("a", pending)
	w.WakeAll()
	if w.Quiet("a") || w.QuietCount() != 0 {
		t.Fatal("quiet after WakeAll")
	}
}
