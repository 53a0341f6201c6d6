package server

import (
	"testing"
	"time"
)

func TestNodeSlots(t *testing.T) {
	n := newNodeSlots(2)
	r1, ok1 := n.acquire("a")
	_, ok2 := n.acquire("a")
	if !ok1 || !ok2 {
		t.Fatal("the first two slots of a were refused")
	}
	if _, ok := n.acquire("a"); ok {
		t.Fatal("a third slot of a was granted")
	}
	if _, ok := n.acquire("b"); !ok {
		t.Fatal("node b was refused because of node a")
	}
	r1()
	r1() // releasing twice frees one slot only
	if got := n.count(); got != 2 {
		t.Fatalf("count = %d, want 2", got)
	}
	if _, ok := n.acquire("a"); !ok {
		t.Fatal("a released slot was not reusable")
	}
	if _, ok := n.acquire("a"); ok {
		t.Fatal("a double release freed two slots")
	}
}

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

func TestLimitDefaults(t *testing.T) {
	var c Config
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.ReadHeaderTimeout != 10*time.Second || c.BodyReadTimeout != 30*time.Second || c.IdleTimeout != 2*time.Minute ||
		c.MaxHeaderBytes != 64<<10 || c.NodeLongPollLimit != 4 || c.Terminal.MaxSessionsPerNode != 16 ||
		c.Terminal.RecheckInterval != 30*time.Second {
		t.Fatalf("defaults %+v", c)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.BodyReadTimeout = -time.Second },
		func(c *Config) { c.MaxHeaderBytes = 100 },
		func(c *Config) { c.NodeLongPollLimit = -1 },
		func(c *Config) { c.Terminal.MaxSessionsPerNode = -1 },
	} {
		var c Config
		bad(&c)
		if err := c.setDefaults(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}
