package terminal

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// manualClock returns a time the test sets.
type manualClock struct{ t time.Time }

func (c *manualClock) Now() time.Time { return c.t }
func (c *manualClock) at(ms int) *manualClock {
	c.t = time.Unix(1700000000, 0).Add(time.Duration(ms) * time.Millisecond)
	return c
}

const golden = `{"version":2,"width":80,"height":24,"timestamp":1700000000,"title":"demo","env":{"SHELL":"/bin/bash","TERM":"xterm-256color"}}
[0.500000, "o", "hello "]
[0.750000, "o", "€!\r\n"]
[1.000000, "i", "ls\r"]
[1.250000, "o", "bad�byte <b>&\u001b[0m"]
[2.000000, "o", "😀"]
[2.500000, "r", "100x30"]
[2.750000, "o", "x"]
[3.000000, "o", "�"]
[3.000000, "i", "�"]
`

func TestRecorderGolden(t *testing.T) {
	clk := (&manualClock{}).at(0)
	var buf bytes.Buffer
	hdr := Header{Width: 80, Height: 24, Title: "demo", Env: map[string]string{"TERM": "xterm-256color", "SHELL": "/bin/bash"}}
	r, err := NewRecorder(&buf, hdr, RecorderOptions{RecordInput: true, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		ms int
		do func() error
	}{
		{500, func() error { return r.Output([]byte("hello \xe2\x82")) }}, // € split: E2 82 | AC
		{750, func() error { return r.Output([]byte("\xac!\r\n")) }},
		{1000, func() error { return r.Input([]byte("ls\r")) }},
		{1250, func() error { return r.Output([]byte("bad\xffbyte <b>&\x1b[0m")) }}, // invalid byte
		{1500, func() error { return r.Output([]byte("\xf0\x9f")) }},                // 😀 in three chunks
		{1750, func() error { return r.Output([]byte("\x98")) }},
		{2000, func() error { return r.Output([]byte("\x80")) }},
		{2500, func() error { return r.Resize(Size{100, 30}) }},
		{2750, func() error { return r.Output([]byte("x\xe2")) }}, // never completed
		{2800, func() error { return r.Input([]byte("\xc3")) }},   // never completed
		{3000, r.Close},
	}
	for i, s := range steps {
		clk.at(s.ms)
		if err := s.do(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if got := buf.String(); got != golden {
		t.Errorf("recording differs\n got:\n%s\nwant:\n%s", got, golden)
	}
	if err := r.Output([]byte("late")); !errors.Is(err, ErrRecorderClosed) {
		t.Errorf("Output after Close err = %v, want ErrRecorderClosed", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestRecorderSkipsInputByDefault(t *testing.T) {
	clk := (&manualClock{}).at(0)
	var buf bytes.Buffer
	r, err := NewRecorder(&buf, Header{Width: 80, Height: 24, Timestamp: 42}, RecorderOptions{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { return r.Input([]byte("hunter2\r")) },
		func() error { return r.Output([]byte("ok")) },
		r.Close,
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	want := "{\"version\":2,\"width\":80,\"height\":24,\"timestamp\":42}\n[0.000000, \"o\", \"ok\"]\n"
	if buf.String() != want {
		t.Errorf("recording = %q, want %q", buf.String(), want)
	}
}

type failWriter struct{ after int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.after == 0 {
		return 0, errors.New("disk full")
	}
	w.after--
	return len(p), nil
}

func TestRecorderWriteErrorsAreSticky(t *testing.T) {
	if _, err := NewRecorder(&failWriter{}, Header{Width: 1, Height: 1}, RecorderOptions{}); err == nil {
		t.Fatal("NewRecorder on a failing writer succeeded")
	}
	r, err := NewRecorder(&failWriter{after: 1}, Header{Width: 1, Height: 1}, RecorderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Output([]byte("a")); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Output err = %v, want disk full", err)
	}
	if err := r.Resize(Size{2, 2}); err == nil {
		t.Fatal("error was not sticky")
	}
	if err := r.Close(); err == nil {
		t.Fatal("Close hid the write error")
	}
}

func TestReadCastRoundTrip(t *testing.T) {
	hdr, events, err := ReadCast(strings.NewReader(golden))
	if err != nil {
		t.Fatal(err)
	}
	wantHdr := Header{Width: 80, Height: 24, Timestamp: 1700000000, Title: "demo",
		Env: map[string]string{"TERM": "xterm-256color", "SHELL": "/bin/bash"}}
	if !reflect.DeepEqual(hdr, wantHdr) {
		t.Errorf("header = %+v, want %+v", hdr, wantHdr)
	}
	want := []Event{
		{0.5, EventOutput, "hello "},
		{0.75, EventOutput, "€!\r\n"},
		{1, EventInput, "ls\r"},
		{1.25, EventOutput, "bad\uFFFDbyte <b>&\x1b[0m"},
		{2, EventOutput, "😀"},
		{2.5, EventResize, "100x30"},
		{2.75, EventOutput, "x"},
		{3, EventOutput, "\uFFFD"},
		{3, EventInput, "\uFFFD"},
	}
	if !reflect.DeepEqual(events, want) {
		t.Errorf("events = %+v\nwant %+v", events, want)
	}
}

func TestReadCastErrors(t *testing.T) {
	for name, in := range map[string]string{
		"empty":        "",
		"version 1":    `{"version":1,"width":80,"height":24}` + "\n",
		"bad header":   "{\n",
		"short event":  `{"version":2,"width":80,"height":24}` + "\n[1.0, \"o\"]\n",
		"bad time":     `{"version":2,"width":80,"height":24}` + "\n[\"1\", \"o\", \"x\"]\n",
		"not an array": `{"version":2,"width":80,"height":24}` + "\n{}\n",
	} {
		if _, _, err := ReadCast(strings.NewReader(in)); err == nil {
			t.Errorf("%s: ReadCast succeeded", name)
		}
	}
	// No trailing newline and blank lines are fine.
	_, ev, err := ReadCast(strings.NewReader(`{"version":2,"width":80,"height":24}` + "\n\n[0.1, \"o\", \"x\"]"))
	if err != nil || len(ev) != 1 {
		t.Errorf("ReadCast without trailing newline = %v, %v", ev, err)
	}
}

func TestIncompleteTail(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 3},
		{"a\xe2", 1},
		{"a\xe2\x82", 1},
		{"a\xe2\x82\xac", 4},
		{"\xf0\x9f\x98", 0},
		{"a\xff", 2},    // invalid, not incomplete
		{"a\x82", 2},    // lone continuation byte
		{"a\xe2x", 3},   // broken sequence, not incomplete
		{"\xed\xa0", 2}, // surrogate prefix can never complete
		{"\x80\x80\x80", 3},
	}
	for _, tt := range tests {
		if got := incompleteTail([]byte(tt.in)); got != tt.want {
			t.Errorf("incompleteTail(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

// FuzzRecorderSplit checks that however PTY output is split into chunks,
// the recorded text is the same valid UTF-8 as recording it in one piece.
func FuzzRecorderSplit(f *testing.F) {
	f.Add([]byte("hello \xe2\x82\xac!"), uint8(7))
	f.Add([]byte("\xf0\x9f\x98\x80\xff\xe2x"), uint8(2))
	f.Add([]byte("\xe2\x82"), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		n := int(step%8) + 1
		var buf bytes.Buffer
		r, err := NewRecorder(&buf, Header{Width: 80, Height: 24}, RecorderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(data); i += n {
			if err := r.Output(data[i:min(i+n, len(data))]); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		_, events, err := ReadCast(&buf)
		if err != nil {
			t.Fatalf("ReadCast: %v\n%s", err, buf.String())
		}
		var got strings.Builder
		for _, ev := range events {
			got.WriteString(ev.Data)
		}
		if want := validUTF8(data); got.String() != want {
			t.Fatalf("chunks of %d: recorded %q, want %q", n, got.String(), want)
		}
	})
}
