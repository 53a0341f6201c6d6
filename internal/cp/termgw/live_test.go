package termgw

import (
	"testing"
)

func TestTermGatewayPerNodeCap(t *testing.T) {
	g := newTermGateway()
	mk := func(id, node string) *liveSession { return &liveSession{id: id, nodeID: node, taskID: "t" + id} }
	s1, s2, s3 := mk("s1", "a"), mk("s2", "a"), mk("s3", "a")
	if !g.add(s1, 2) || !g.add(s2, 2) {
		t.Fatal("sessions under the cap refused")
	}
	if g.add(s3, 2) {
		t.Fatal("a third session of node a admitted")
	}
	if !g.add(mk("s4", "b"), 2) {
		t.Fatal("node b refused because of node a")
	}
	g.remove(s3) // never added: must not free a slot
	if got := g.nodeCount("a"); got != 2 {
		t.Fatalf("node a count = %d, want 2", got)
	}
	g.remove(s1)
	if !g.add(s3, 2) {
		t.Fatal("a freed slot was not reusable")
	}
	if got := len(g.matching(func(l *liveSession) bool { return l.nodeID == "a" })); got != 2 {
		t.Fatalf("matching node a = %d, want 2", got)
	}
}
