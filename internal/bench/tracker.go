package bench

// Matching deliveries to enqueued tasks, and the numeric helpers of the
// report.

import (
	"sync"
	"time"
)

func secs(d time.Duration) float64 { return round2(d.Seconds()) }

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

func perSec(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return round2(float64(n) / d.Seconds())
}

// tracker matches deliveries to the tasks the harness enqueued, by
// correlation id (set before the enqueue call, so a delivery that beats the
// enqueue response is still matched).
type tracker struct {
	mu sync.Mutex
	m  map[string]*pending
}

type pending struct {
	start     time.Time
	delivered chan time.Time
	done      chan result
}

type result struct {
	at  time.Time
	err error
}

func newTracker() *tracker { return &tracker{m: make(map[string]*pending)} }

func (t *tracker) add(cid string) *pending {
	p := &pending{delivered: make(chan time.Time, 1), done: make(chan result, 1)}
	t.mu.Lock()
	t.m[cid] = p
	t.mu.Unlock()
	return p
}

func (t *tracker) get(cid string) *pending {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[cid]
}

func (t *tracker) remove(cid string) {
	t.mu.Lock()
	delete(t.m, cid)
	t.mu.Unlock()
}

// deliver and finish never block: a task delivered twice (requeued) is
// counted once.
func (p *pending) deliver(at time.Time) {
	select {
	case p.delivered <- at:
	default:
	}
}

func (p *pending) finish(at time.Time, err error) {
	select {
	case p.done <- result{at: at, err: err}:
	default:
	}
}
