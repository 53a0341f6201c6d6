package httpapi

import "testing"

func TestNodeSlots(t *testing.T) {
	n := NewSlots(2)
	r1, ok1 := n.Acquire("a")
	_, ok2 := n.Acquire("a")
	if !ok1 || !ok2 {
		t.Fatal("the first two slots of a were refused")
	}
	if _, ok := n.Acquire("a"); ok {
		t.Fatal("a third slot of a was granted")
	}
	if _, ok := n.Acquire("b"); !ok {
		t.Fatal("node b was refused because of node a")
	}
	r1()
	r1() // releasing twice frees one slot only
	if got := n.Count(); got != 2 {
		t.Fatalf("count = %d, want 2", got)
	}
	if _, ok := n.Acquire("a"); !ok {
		t.Fatal("a released slot was not reusable")
	}
	if _, ok := n.Acquire("a"); ok {
		t.Fatal("a double release freed two slots")
	}
}
