package logstream

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestDataRoundTripAndLimits(t *testing.T) {
	for _, s := range []Stream{Stdout, Stderr, Serial} {
		msg, err := EncodeData(s, []byte("hello\n"))
		if err != nil {
			t.Fatal(err)
		}
		f, err := Decode(msg)
		if err != nil || f.Stream != s || string(f.Data) != "hello\n" || f.End != nil {
			t.Errorf("%s: decoded %+v, %v", s, f, err)
		}
	}
	if _, err := EncodeData(Stdout, bytes.Repeat([]byte("x"), MaxLine+1)); !errors.Is(err, ErrProtocol) {
		t.Errorf("a line over MaxLine encoded: %v", err)
	}
	if _, err := EncodeData("stdin", nil); !errors.Is(err, ErrProtocol) {
		t.Errorf("an unknown stream encoded: %v", err)
	}
	for name, msg := range map[string][]byte{"empty": nil, "kind": {9, 'x'}, "too long": make([]byte, MaxFrame+1),
		"end not json": {0, '{'}, "end without reason": append([]byte{0}, `{"code":"x"}`...)} {
		if _, err := Decode(msg); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: decoded without a protocol error: %v", name, err)
		}
	}
}

func TestEndRoundTripAndCut(t *testing.T) {
	f, err := Decode(EncodeEnd(End{Reason: ReasonError, Code: "logs_read_failed", Message: "disk gone"}))
	if err != nil || f.End == nil || f.End.Reason != ReasonError || f.End.Code != "logs_read_failed" || f.End.Message != "disk gone" {
		t.Fatalf("end = %+v, %v", f.End, err)
	}
	msg := EncodeEnd(End{Reason: ReasonError, Message: strings.Repeat("m", 100000)})
	if len(msg) > MaxFrame {
		t.Errorf("a long end frame is %d bytes, over MaxFrame", len(msg))
	}
	if _, err := Decode(msg); err != nil {
		t.Errorf("cut end frame: %v", err)
	}
}
