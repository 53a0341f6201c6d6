package hosts

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// failLimiter rate-limits failures per key (a client network, a host id):
// a token bucket per key that only failures drain, so successful requests
// cost nothing and a key that keeps failing is refused until its bucket
// refills. Buckets are created only by failures, which the per-source key
// bounds, and full ones are forgotten.
type failLimiter struct {
	limit rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	swept   time.Time
}

func newFailLimiter(limit rate.Limit, burst int, now func() time.Time) *failLimiter {
	return &failLimiter{limit: limit, burst: burst, now: now, buckets: make(map[string]*rate.Limiter)}
}

// blocked reports whether any of keys has no failure left and, if so, after
// how many seconds the last of them has one again.
func (l *failLimiter) blocked(keys ...string) (bool, int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var wait time.Duration
	for _, k := range keys {
		b := l.buckets[k]
		if b == nil {
			continue
		}
		if tokens := b.TokensAt(now); tokens < 1 {
			d := time.Duration((1 - tokens) / float64(l.limit) * float64(time.Second))
			if math.IsInf(float64(l.limit), 1) {
				d = 0
			}
			wait = max(wait, d)
		}
	}
	if wait <= 0 {
		return false, 0
	}
	return true, max(1, int(math.Ceil(wait.Seconds())))
}

// fail records one failure against each key.
func (l *failLimiter) fail(keys ...string) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > time.Minute {
		for k, b := range l.buckets {
			if b.TokensAt(now) >= float64(l.burst) {
				delete(l.buckets, k)
			}
		}
		l.swept = now
	}
	for _, k := range keys {
		b := l.buckets[k]
		if b == nil {
			b = rate.NewLimiter(l.limit, l.burst)
			l.buckets[k] = b
		}
		b.AllowN(now, 1) // drains one token; already empty stays empty
	}
}
