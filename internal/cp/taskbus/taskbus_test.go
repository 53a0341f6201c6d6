package taskbus

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/drover-dev/drover/internal/cp/store"
)

func TestPublishReachesOnlyTheTaskTypeInOrder(t *testing.T) {
	b := New()
	var got []string
	b.OnFinished("a", func(_ context.Context, e Finished) { got = append(got, "a1:"+e.Task.ID) })
	b.OnFinished("b", func(_ context.Context, e Finished) { got = append(got, "b:"+e.Task.ID) })
	b.OnFinished("a", func(_ context.Context, e Finished) { got = append(got, "a2:"+e.Task.ID) })
	b.OnDispatched("a", func(_ context.Context, e Dispatched) { got = append(got, "d:"+e.Task.ID) })

	ctx := context.Background()
	b.PublishFinished(ctx, Finished{Task: store.Task{ID: "t1", Type: "a"}})
	b.PublishFinished(ctx, Finished{Task: store.Task{ID: "t2", Type: "c"}}) // no subscriber
	b.PublishDispatched(ctx, Dispatched{Task: store.Task{ID: "t3", Type: "a"}})
	b.PublishDispatched(ctx, Dispatched{Task: store.Task{ID: "t4", Type: "b"}}) // b has no dispatched subscriber
	b.PublishFinished(ctx, Finished{Task: store.Task{ID: "t5", Type: "b"}})

	want := []string{"a1:t1", "a2:t1", "d:t3", "b:t5"}
	if !slices.Equal(got, want) {
		t.Fatalf("deliveries = %v, want %v", got, want)
	}
}

func TestPublishIsSynchronousAndPassesContext(t *testing.T) {
	type key struct{}
	b := New()
	var seen any
	b.OnDispatched("x", func(ctx context.Context, _ Dispatched) { seen = ctx.Value(key{}) })
	b.PublishDispatched(context.WithValue(context.Background(), key{}, "v"), Dispatched{Task: store.Task{Type: "x"}})
	if seen != "v" { // read right after Publish returned: no wait needed
		t.Fatalf("subscriber saw %v, want the publisher's context value", seen)
	}
}

func TestSubscriberMayPublishAndSubscribe(t *testing.T) {
	b := New()
	n := 0
	b.OnFinished("x", func(ctx context.Context, e Finished) {
		n++
		b.OnFinished("y", func(context.Context, Finished) { n += 10 })
		b.PublishFinished(ctx, Finished{Task: store.Task{Type: "y"}})
	})
	b.PublishFinished(context.Background(), Finished{Task: store.Task{Type: "x"}})
	if n != 11 {
		t.Fatalf("n = %d, want 11 (no deadlock, nested publish delivered)", n)
	}
}

func TestConcurrentPublish(t *testing.T) {
	b := New()
	var mu sync.Mutex
	count := 0
	b.OnFinished("x", func(context.Context, Finished) { mu.Lock(); count++; mu.Unlock() })
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.PublishFinished(context.Background(), Finished{Task: store.Task{Type: "x"}})
			}
		})
	}
	b.OnDispatched("x", func(context.Context, Dispatched) {}) // subscribing while others publish is safe
	wg.Wait()
	if count != 800 {
		t.Fatalf("count = %d, want 800", count)
	}
}
