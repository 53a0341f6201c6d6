package nodeapi

import (
	"crypto/tls"
	"testing"
)

// TestSessionCacheSurvivesTransientFailures: a failed handshake does not
// throw the ticket away at once; MaxTicketFailures in a row do, and a new
// ticket starts the count again.
func TestSessionCacheSurvivesTransientFailures(t *testing.T) {
	c := NewSessionCache(4)
	t1, t2 := &tls.ClientSessionState{}, &tls.ClientSessionState{}
	c.Put("a", t1)
	c.Put("b", t2)
	for i := range MaxTicketFailures - 1 {
		c.Put("a", nil)
		if got, ok := c.Get("a"); !ok || got != t1 {
			t.Fatalf("after %d failures the ticket is gone", i+1)
		}
	}
	c.Put("a", nil)
	if _, ok := c.Get("a"); ok {
		t.Fatalf("ticket kept after %d failures in a row", MaxTicketFailures)
	}
	if got, ok := c.Get("b"); !ok || got != t2 {
		t.Fatal("another key's ticket was dropped")
	}
	c.Put("a", t1)
	c.Put("a", nil)
	c.Put("a", t2) // a successful handshake's new ticket resets the count
	for range MaxTicketFailures - 1 {
		c.Put("a", nil)
	}
	if got, ok := c.Get("a"); !ok || got != t2 {
		t.Fatal("a failure before the last success still counted")
	}
}
