package terminal

import (
	"bytes"
	"errors"
	"testing"
)

func TestEncodeDecode(t *testing.T) {
	tests := []struct {
		name    string
		msg     []byte
		ch      Channel
		payload []byte
		wantErr bool
	}{
		{name: "stdin", msg: Encode(ChanStdin, []byte("ls\r")), ch: ChanStdin, payload: []byte("ls\r")},
		{name: "stdout split utf8", msg: Encode(ChanStdout, []byte{'a', 0xe2, 0x82}), ch: ChanStdout, payload: []byte{'a', 0xe2, 0x82}},
		{name: "resize", msg: Encode(ChanResize, []byte(`{"cols":80,"rows":24}`)), ch: ChanResize, payload: []byte(`{"cols":80,"rows":24}`)},
		{name: "control", msg: Encode(ChanControl, []byte(`{"type":"ping"}`)), ch: ChanControl, payload: []byte(`{"type":"ping"}`)},
		{name: "empty payload", msg: []byte{1}, ch: ChanStdout, payload: []byte{}},
		{name: "empty frame", msg: nil, wantErr: true},
		{name: "stderr unused", msg: []byte{2, 'x'}, wantErr: true},
		{name: "unknown channel", msg: []byte{5}, wantErr: true},
		{name: "high channel", msg: []byte{0xff, 'x'}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch, payload, err := Decode(tt.msg)
			if tt.wantErr {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("Decode(%v) err = %v, want ErrProtocol", tt.msg, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if ch != tt.ch || !bytes.Equal(payload, tt.payload) {
				t.Errorf("Decode = %v %q, want %v %q", ch, payload, tt.ch, tt.payload)
			}
		})
	}
}

func TestEncodeCopiesPayload(t *testing.T) {
	p := []byte("abc")
	msg := Encode(ChanStdin, p)
	p[0] = 'x'
	if string(msg) != "\x00abc" {
		t.Errorf("Encode = %q, want %q", msg, "\x00abc")
	}
}

func TestTokenFromProtocols(t *testing.T) {
	tests := []struct {
		name    string
		offered []string
		want    string
		wantErr bool
	}{
		{name: "ok", offered: []string{Subprotocol, "drover.token.abc-123_X.y"}, want: "abc-123_X.y"},
		{name: "order and spaces", offered: []string{" drover.token.t0k ", "other", Subprotocol}, want: "t0k"},
		{name: "no protocol", offered: []string{"drover.token.abc"}, wantErr: true},
		{name: "no token", offered: []string{Subprotocol}, wantErr: true},
		{name: "empty token", offered: []string{Subprotocol, "drover.token."}, wantErr: true},
		{name: "two tokens", offered: []string{Subprotocol, "drover.token.a", "drover.token.b"}, wantErr: true},
		{name: "bad char", offered: []string{Subprotocol, "drover.token.a/b"}, wantErr: true},
		{name: "nothing", offered: nil, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := TokenFromProtocols(tt.offered)
			if tt.wantErr {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("err = %v, want ErrProtocol", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("TokenFromProtocols = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestClientProtocolsRoundTrip(t *testing.T) {
	protos, err := ClientProtocols("eyJhbGciOi.J9-x_y")
	if err != nil {
		t.Fatal(err)
	}
	got, err := TokenFromProtocols(protos)
	if err != nil || got != "eyJhbGciOi.J9-x_y" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	for _, bad := range []string{"", "a b", "a,b", "a\"b", "é"} {
		if _, err := ClientProtocols(bad); err == nil {
			t.Errorf("ClientProtocols(%q) succeeded, want error", bad)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 'a'})
	f.Add([]byte{2})
	f.Add(Encode(ChanControl, []byte(`{"type":"error","code":"token_expired","retryable":true}`)))
	f.Add(Encode(ChanResize, []byte(`{"cols":0,"rows":24}`)))
	f.Fuzz(func(t *testing.T, msg []byte) {
		ch, payload, err := Decode(msg)
		if err != nil {
			return
		}
		if !bytes.Equal(Encode(ch, payload), msg) {
			t.Fatalf("Encode(Decode(%q)) differs", msg)
		}
		switch ch {
		case ChanControl:
			if c, err := DecodeControl(payload); err == nil {
				if _, err := EncodeControl(c); err != nil {
					t.Fatalf("decoded control %+v does not re-encode: %v", c, err)
				}
			}
		case ChanResize:
			if s, err := DecodeResize(payload); err == nil && (s.Cols == 0 || s.Rows == 0 || s.Cols > MaxCols || s.Rows > MaxRows) {
				t.Fatalf("DecodeResize gave out-of-bounds %v", s)
			}
		}
	})
}
