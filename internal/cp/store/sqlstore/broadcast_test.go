package sqlstore

import (
	"context"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

func TestBroadcaster(t *testing.T) {
	b := NewBroadcaster()
	ctx, cancel := context.WithCancel(context.Background())
	c1 := b.Subscribe(ctx)
	c2 := b.Subscribe(context.Background())
	ev := store.Event{Kind: store.EventTask, ID: "n1"}
	b.Publish(ev)
	for _, c := range []<-chan store.Event{c1, c2} {
		if got := <-c; got != ev {
			t.Fatalf("got %+v", got)
		}
	}
	// A full subscriber does not block publishers.
	for range SubscriberBuffer + 10 {
		b.Publish(ev)
	}
	cancel()
	waitClosed(t, c1)
	if n := b.Subscribers(); n != 1 {
		t.Fatalf("%d subscribers after cancel, want 1", n)
	}
	b.Close()
	waitClosed(t, c2)
	waitClosed(t, b.Subscribe(context.Background()))
	b.Publish(ev) // after Close: no panic
}

func waitClosed(t *testing.T, c <-chan store.Event) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-c:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("channel not closed")
		}
	}
}

func TestCodec(t *testing.T) {
	if ms(time.Time{}) != 0 || !tm(0).IsZero() {
		t.Fatal("zero time must map to 0 and back")
	}
	in := time.Date(2025, 1, 2, 3, 4, 5, 678_900_000, time.FixedZone("x", 3600))
	out := tm(ms(in))
	if !out.Equal(in.Truncate(time.Millisecond)) || out.Location() != time.UTC {
		t.Fatalf("round trip %v -> %v", in, out)
	}
	l, err := textLabels("{}")
	if err != nil || l != nil {
		t.Fatalf("textLabels({}) = %v, %v", l, err)
	}
	a, b := nextAuditID(), nextAuditID()
	if b <= a {
		t.Fatalf("audit ids not increasing: %d %d", a, b)
	}
}
