package terminal

import (
	"errors"
	"strings"
	"testing"
)

func TestControlRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		c    Control
		wire string
	}{
		{"status", Status(ProgressNodeConnecting), `{"type":"status","state":"node_connecting"}`},
		{"ready", Ready("ts-42"), `{"type":"ready","session_id":"ts-42"}`},
		{"exit zero", Exit(0), `{"type":"exit","code":0}`},
		{"exit nonzero", Exit(130), `{"type":"exit","code":130}`},
		{"error retryable", Error(CodeTokenExpired, "expired 3s ago"),
			`{"type":"error","code":"token_expired","message":"expired 3s ago","retryable":true}`},
		{"error not retryable", Error(CodeNodeStreamTimeout, ""),
			`{"type":"error","code":"node_stream_timeout","retryable":false}`},
		{"ping", Ping(), `{"type":"ping"}`},
		{"pong", Pong(), `{"type":"pong"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := EncodeControl(tt.c)
			if err != nil {
				t.Fatalf("EncodeControl: %v", err)
			}
			if string(b) != tt.wire {
				t.Errorf("EncodeControl = %s, want %s", b, tt.wire)
			}
			got, err := DecodeControl(b)
			if err != nil {
				t.Fatalf("DecodeControl: %v", err)
			}
			if got != tt.c {
				t.Errorf("round trip = %+v, want %+v", got, tt.c)
			}
		})
	}
}

func TestDecodeControlRejects(t *testing.T) {
	for _, in := range []string{
		``,
		`   `,
		`null`,
		`[]`,
		`{`,
		`{}`,
		`{"type":"resize"}`,
		`{"type":"PING"}`,
		`{"type":"status"}`,
		`{"type":"status","state":"pty_ready"}`,
		`{"type":"ready"}`,
		`{"type":"exit"}`,
		`{"type":"exit","code":"1"}`,
		`{"type":"exit","code":1.5}`,
		`{"type":"error","code":7}`,
		`{"type":"error"}`,
		`{"type":"error","code":"disk_full"}`,
	} {
		if c, err := DecodeControl([]byte(in)); !errors.Is(err, ErrProtocol) {
			t.Errorf("DecodeControl(%s) = %+v, %v; want ErrProtocol", in, c, err)
		}
	}
	if _, err := EncodeControl(Control{Type: "bogus"}); !errors.Is(err, ErrProtocol) {
		t.Errorf("EncodeControl(bogus) err = %v, want ErrProtocol", err)
	}
}

func TestErrorCodesComplete(t *testing.T) {
	want := []string{"node_offline", "dispatch_timeout", "node_stream_timeout", "terminal_pty_failed",
		"terminal_node_stream_mtls_failed", "terminal_open_without_stream", "token_invalid", "token_expired",
		"token_reused", "token_in_url", "token_wrong_allocation", "allocation_inactive", "gateway_error", "origin_forbidden", "protocol_error", "session_idle_timeout", "session_max_lifetime",
		"terminal_revoked", "terminal_session_limit"}
	codes := ErrorCodes()
	if len(codes) != len(want) || len(codeTable()) != len(want) {
		t.Fatalf("ErrorCodes has %d, table %d, want %d", len(codes), len(codeTable()), len(want))
	}
	generic := RecoveryText("no_such_code")
	for i, code := range codes {
		if string(code) != want[i] {
			t.Errorf("ErrorCodes()[%d] = %q, want %q", i, code, want[i])
		}
		if !KnownCode(code) {
			t.Errorf("%s: not known", code)
		}
		if txt := RecoveryText(code); txt == generic || len(txt) < 20 || !strings.HasSuffix(txt, ".") {
			t.Errorf("%s: recovery text %q", code, txt)
		}
		if cc := CloseCode(code); cc < 4001 || cc > 4999 {
			t.Errorf("%s: close code %d not in 4001..4999", code, cc)
		}
		if Error(code, "").Retryable != Retryable(code) {
			t.Errorf("%s: Error() retryable disagrees with table", code)
		}
	}
	if KnownCode("no_such_code") || Retryable("no_such_code") || CloseCode("no_such_code") != CloseUnknown {
		t.Error("unknown code must be unknown, not retryable, CloseUnknown")
	}
}

func TestCloseCodesAndRetry(t *testing.T) {
	tests := []struct {
		code      ErrorCode
		close     int
		retryable bool
	}{
		{CodeTokenInvalid, 4401, false},
		{CodeTokenExpired, 4401, true},
		{CodeTokenReused, 4401, true},
		{CodeOriginForbidden, 4403, false},
		{CodeNodeOffline, 4404, true},
		{CodeDispatchTimeout, 4408, true},
		{CodeNodeStreamTimeout, 4408, false},
		{CodeSessionIdleTimeout, 4408, true},
		{CodeSessionMaxLifetime, 4408, true},
		{CodePTYFailed, 4500, false},
		{CodeNodeStreamMTLSFailed, 4502, false},
		{CodeOpenWithoutStream, 4502, false},
		{CodeProtocolError, 4400, false},
		{CodeTerminalRevoked, 4403, false},
		{CodeSessionLimit, 4429, true},
	}
	for _, tt := range tests {
		if got := CloseCode(tt.code); got != tt.close {
			t.Errorf("CloseCode(%s) = %d, want %d", tt.code, got, tt.close)
		}
		if got := Retryable(tt.code); got != tt.retryable {
			t.Errorf("Retryable(%s) = %v, want %v", tt.code, got, tt.retryable)
		}
	}
}

func TestStates(t *testing.T) {
	want := []State{"token_ready", "browser_ws_ready", "terminal_open_sent", "node_stream_connected", "pty_ready", "failed"}
	got := States()
	if len(got) != len(want) {
		t.Fatalf("States() = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] || !ValidState(want[i]) {
			t.Errorf("state %d: %q valid=%v, want %q", i, got[i], ValidState(got[i]), want[i])
		}
	}
	for _, bad := range []State{"", "ready", "PTY_READY", "queued"} {
		if ValidState(bad) {
			t.Errorf("ValidState(%q) = true", bad)
		}
	}
}
