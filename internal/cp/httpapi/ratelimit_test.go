package httpapi

import (
	"net/http/httptest"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestLimitKey(t *testing.T) {
	tests := []struct {
		addr, want string
	}{
		{"192.0.2.7:1234", "192.0.2.7"},
		{"192.0.2.7", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:1234", "192.0.2.7"}, // IPv4-mapped: the IPv4 address
		{"[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2::1]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2::1%eth0]:443", "2001:db8:1:2::/64"}, // zone dropped
		{"[2001:db8:1:3::1]:443", "2001:db8:1:3::/64"},
		{"[::1]:80", "::/64"},
		{"not-an-address", "not-an-address"},
	}
	for _, tt := range tests {
		if got := LimitKey(tt.addr); got != tt.want {
			t.Errorf("LimitKey(%q) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// TestIPLimiterIPv6Prefix rotates through addresses of one /64: they share
// one bucket, so the burst is spent across them; another /64 and another
// IPv4 address are unaffected, and an IPv4-mapped IPv6 address shares the
// bucket of its IPv4 address.
func TestIPLimiterIPv6Prefix(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewIPLimiter(rate.Limit(1), 3, func() time.Time { return now })
	allow := func(addr string) bool {
		r := httptest.NewRequest("POST", "/", nil)
		r.RemoteAddr = addr
		ok, _ := l.Allow(r)
		return ok
	}
	steps := []struct {
		addr string
		want bool
	}{
		{"[2001:db8:aa:bb::1]:1000", true},
		{"[2001:db8:aa:bb::2]:1001", true},
		{"[2001:db8:aa:bb:ffff:ffff:ffff:ffff]:1002", true},
		{"[2001:db8:aa:bb:1234::9]:1003", false}, // same /64: burst of 3 spent
		{"[2001:db8:aa:bc::1]:1004", true},       // the next /64 has its own bucket
		{"198.51.100.1:1", true},
		{"[::ffff:198.51.100.1]:2", true},
		{"198.51.100.1:3", true},
		{"[::ffff:198.51.100.1]:4", false}, // mapped and plain IPv4 share a bucket
		{"198.51.100.2:5", true},
	}
	for i, s := range steps {
		if got := allow(s.addr); got != s.want {
			t.Errorf("#%d %s: allowed = %v, want %v", i, s.addr, got, s.want)
		}
	}
}
