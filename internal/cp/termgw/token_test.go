package termgw

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

// TestTerminalSessionView: an unused token that expired shows as closed
// (token_expired), a redeemed or still-valid one does not, and failures an
// operator acts on carry their signal.
func TestTerminalSessionView(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	past, future := now.Add(-time.Minute), now.Add(time.Minute)
	tests := []struct {
		name       string
		s          store.TerminalSession
		wantReason string
		closed     bool
		wantSignal string
	}{
		{"unused token expired", store.TerminalSession{State: "token_ready", TokenExpiresAt: past}, "token_expired", true, ""},
		{"unused token still valid", store.TerminalSession{State: "token_ready", TokenExpiresAt: future}, "", false, ""},
		{"redeemed token past its expiry, session open", store.TerminalSession{State: "pty_ready", TokenExpiresAt: past, TokenUsedAt: past}, "", false, ""},
		{"browser closed", store.TerminalSession{State: "pty_ready", TokenExpiresAt: past, TokenUsedAt: past, ClosedAt: now, CloseReason: "browser_closed"}, "browser_closed", true, ""},
		{"node stream timeout", store.TerminalSession{State: "failed", TokenUsedAt: past, ClosedAt: now, ErrorCode: "node_stream_timeout", CloseReason: "node_stream_timeout"},
			"node_stream_timeout", true, "terminal_node_stream_timeout"},
		{"pty failed", store.TerminalSession{State: "failed", TokenUsedAt: past, ClosedAt: now, ErrorCode: "terminal_pty_failed"}, "", true, "terminal_pty_failed"},
		{"token reused is the user's error", store.TerminalSession{State: "failed", TokenUsedAt: past, ClosedAt: now, ErrorCode: "token_reused"}, "", true, ""},
	}
	for _, tc := range tests {
		v := terminalSessionView(tc.s, now)
		if v.CloseReason != tc.wantReason || (v.ClosedAt != nil) != tc.closed || v.Signal != tc.wantSignal {
			t.Errorf("%s: close_reason %q closed %v signal %q; want %q %v %q", tc.name, v.CloseReason, v.ClosedAt != nil, v.Signal,
				tc.wantReason, tc.closed, tc.wantSignal)
		}
	}
}
