package hosts

import (
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestFailLimiter(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newFailLimiter(rate.Every(10*time.Second), 2, func() time.Time { return now })
	if blocked, _ := l.blocked("src:a", "host:h"); blocked {
		t.Fatal("blocked before any failure")
	}
	l.fail("src:a", "host:h")
	if blocked, _ := l.blocked("src:a", "host:h"); blocked {
		t.Fatal("blocked after one failure of a burst of two")
	}
	l.fail("src:a", "host:h")
	blocked, after := l.blocked("src:b", "host:h")
	if !blocked || after != 10 {
		t.Fatalf("host h after two failures: blocked %v after %d, want blocked for 10s", blocked, after)
	}
	if blocked, _ := l.blocked("src:b", "host:other"); blocked {
		t.Fatal("an unrelated source and host are blocked")
	}
	l.fail("src:a", "host:h") // failing while blocked keeps it blocked, no debt beyond empty
	now = now.Add(10 * time.Second)
	if blocked, _ := l.blocked("src:a"); blocked {
		t.Fatal("still blocked after the refill interval")
	}
	// Full buckets are forgotten on the next sweep.
	now = now.Add(time.Hour)
	l.fail("src:z")
	l.mu.Lock()
	n := len(l.buckets)
	l.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d buckets after the sweep, want only src:z", n)
	}
}
