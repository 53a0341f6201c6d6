package httpapi

import (
	"math"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// IPLimiter is a token bucket per client network for unauthenticated
// routes: one per IPv4 address and one per IPv6 /64, since an IPv6 client
// usually controls a whole /64 and could rotate through it.
type IPLimiter struct {
	limit rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	swept   time.Time
}

func NewIPLimiter(limit rate.Limit, burst int, now func() time.Time) *IPLimiter {
	return &IPLimiter{limit: limit, burst: burst, now: now, buckets: make(map[string]*rate.Limiter)}
}

// Allow reports whether r may proceed and, if not, after how many seconds.
func (l *IPLimiter) Allow(r *http.Request) (bool, int) {
	ip := LimitKey(r.RemoteAddr)
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

// LimitKey is the bucket of a client address ("host:port" or a bare
// address): an IPv4 address as itself, an IPv4-mapped IPv6 address as the
// IPv4 address it maps, an IPv6 address as its /64 prefix. Anything
// unparsable is its own bucket.
func LimitKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return addr.String()
	}
	p, _ := addr.Prefix(64) // cannot fail for IPv6
	return p.String()
}
