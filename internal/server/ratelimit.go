package server

import (
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// ipLimiter is a token bucket per client IP for unauthenticated routes.
type ipLimiter struct {
	limit rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	swept   time.Time
}

func newIPLimiter(limit rate.Limit, burst int, now func() time.Time) *ipLimiter {
	return &ipLimiter{limit: limit, burst: burst, now: now, buckets: make(map[string]*rate.Limiter)}
}

// allow reports whether r may proceed and, if not, after how many seconds.
func (l *ipLimiter) allow(r *http.Request) (bool, int) {
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		ip = r.RemoteAddr
	}
	now := l.now()
	l.mu.Lock()
	if now.Sub(l.swept) > time.Minute { // forget idle buckets
		for k, b := range l.buckets {
			if b.TokensAt(now) >= float64(l.burst) {
				delete(l.buckets, k)
			}
		}
		l.swept = now
	}
	b := l.buckets[ip]
	if b == nil {
		b = rate.NewLimiter(l.limit, l.burst)
		l.buckets[ip] = b
	}
	l.mu.Unlock()
	res := b.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return false, int(math.Ceil(d.Seconds()))
	}
	return true, 0
}
