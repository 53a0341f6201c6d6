package httpapi

import (
	"net/http/httptest"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestIPLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewIPLimiter(rate.Limit(1), 2, func() time.Time { return now })
	req := func(ip string) (bool, int) {
		r := httptest.NewRequest("POST", "/", nil)
		r.RemoteAddr = ip + ":1234"
		return l.Allow(r)
	}
	tests := []struct {
		ip        string
		advance   time.Duration
		wantOK    bool
		wantAfter int
	}{
		{"10.0.0.1", 0, true, 0},
		{"10.0.0.1", 0, true, 0},
		{"10.0.0.1", 0, false, 1},                      // burst spent
		{"10.0.0.2", 0, true, 0},                       // other addresses have their own bucket
		{"10.0.0.1", 1100 * time.Millisecond, true, 0}, // refilled
	}
	for i, tt := range tests {
		now = now.Add(tt.advance)
		ok, after := req(tt.ip)
		if ok != tt.wantOK || after != tt.wantAfter {
			t.Errorf("#%d %s: allow = %v, %d; want %v, %d", i, tt.ip, ok, after, tt.wantOK, tt.wantAfter)
		}
	}
}

func TestCorrelationIDs(t *testing.T) {
	tests := []struct {
		in   string
		keep bool
	}{
		{"abc-123", true},
		{"cid_0f:ok.x", true},
		{"", false},
		{"has space", false},
		{"<script>", false},
	}
	for _, tt := range tests {
		if got := correlationRE.MatchString(tt.in); got != tt.keep {
			t.Errorf("%q: kept = %v, want %v", tt.in, got, tt.keep)
		}
	}
}
