package terminal

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestClamp(t *testing.T) {
	tests := []struct {
		in      Size
		want    Size
		wantErr bool
	}{
		{in: Size{80, 24}, want: Size{80, 24}},
		{in: Size{1, 1}, want: Size{1, 1}},
		{in: Size{1000, 500}, want: Size{1000, 500}},
		{in: Size{1001, 501}, want: Size{1000, 500}},
		{in: Size{65535, 65535}, want: Size{1000, 500}},
		{in: Size{0, 24}, wantErr: true},
		{in: Size{80, 0}, wantErr: true},
		{in: Size{}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := Clamp(tt.in)
		if tt.wantErr {
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("Clamp(%v) err = %v, want ErrProtocol", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Clamp(%v) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestResizeRoundTrip(t *testing.T) {
	if got := string(EncodeResize(Size{120, 40})); got != `{"cols":120,"rows":40}` {
		t.Errorf("EncodeResize = %s", got)
	}
	tests := []struct {
		in      string
		want    Size
		wantErr bool
	}{
		{in: `{"cols":120,"rows":40}`, want: Size{120, 40}},
		{in: `{"cols":5000,"rows":40}`, want: Size{1000, 40}},
		{in: `{"cols":0,"rows":40}`, wantErr: true},
		{in: `{"cols":-1,"rows":40}`, wantErr: true},
		{in: `{"cols":70000,"rows":40}`, wantErr: true},
		{in: `{"rows":40}`, wantErr: true},
		{in: `80x24`, wantErr: true},
		{in: ``, wantErr: true},
	}
	for _, tt := range tests {
		got, err := DecodeResize([]byte(tt.in))
		if tt.wantErr {
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("DecodeResize(%s) = %v, %v; want ErrProtocol", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("DecodeResize(%s) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// fakeClock is a manual clock whose timers fire only in Advance.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

// Advance moves time forward and runs the timers that became due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for _, t := range c.timers {
		if !t.stopped && !t.at.After(c.now) {
			t.stopped = true
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped {
			n++
		}
	}
	return n
}

type sink struct {
	mu  sync.Mutex
	got []Size
}

func (s *sink) deliver(sz Size) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, sz)
}

func (s *sink) take() []Size {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.got
	s.got = nil
	return got
}

func newTestDebouncer() (*Debouncer, *fakeClock, *sink) {
	clk := &fakeClock{now: time.Unix(1700000000, 0)}
	s := &sink{}
	d := NewDebouncer(100*time.Millisecond, s.deliver, DebouncerOptions{Now: clk.Now, AfterFunc: clk.AfterFunc})
	return d, clk, s
}

func expectSizes(t *testing.T, step string, got []Size, want ...Size) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: delivered %v, want %v", step, got, want)
	}
}

func TestDebouncerCoalesces(t *testing.T) {
	d, clk, s := newTestDebouncer()
	d.Set(Size{80, 24})
	expectSizes(t, "first set is immediate", s.take(), Size{80, 24})

	d.Set(Size{81, 24})
	d.Set(Size{82, 24})
	d.Set(Size{83, 25})
	expectSizes(t, "burst within interval", s.take())
	if n := clk.pending(); n != 1 {
		t.Fatalf("%d timers pending, want 1", n)
	}
	clk.Advance(99 * time.Millisecond)
	expectSizes(t, "before interval", s.take())
	clk.Advance(time.Millisecond)
	expectSizes(t, "trailing delivery is the latest", s.take(), Size{83, 25})

	clk.Advance(time.Second)
	expectSizes(t, "nothing pending", s.take())
	d.Set(Size{90, 30})
	expectSizes(t, "after a quiet interval, immediate", s.take(), Size{90, 30})
}

func TestDebouncerHoldAndFlush(t *testing.T) {
	d, clk, s := newTestDebouncer()
	d.Hold(true)
	d.Set(Size{80, 24})
	d.Set(Size{100, 30})
	clk.Advance(time.Second)
	d.Flush()
	expectSizes(t, "held", s.take())

	d.Hold(false)
	expectSizes(t, "release delivers latest", s.take(), Size{100, 30})

	d.Set(Size{101, 30})
	expectSizes(t, "within interval", s.take())
	d.Flush()
	expectSizes(t, "flush ignores interval", s.take(), Size{101, 30})
	clk.Advance(time.Second)
	expectSizes(t, "flush cancelled the timer", s.take())

	d.Flush()
	expectSizes(t, "flush with nothing pending", s.take())

	d.Set(Size{102, 29})
	expectSizes(t, "after a quiet interval", s.take(), Size{102, 29})
	d.Set(Size{102, 30})
	d.Hold(true)
	clk.Advance(time.Second)
	expectSizes(t, "hold cancels the trailing delivery", s.take())
	d.Hold(false)
	expectSizes(t, "release", s.take(), Size{102, 30})

	d.Set(Size{103, 30})
	d.Stop()
	clk.Advance(time.Second)
	d.Set(Size{104, 30})
	d.Flush()
	expectSizes(t, "stopped", s.take())
}

func TestDebouncerRealClock(t *testing.T) {
	got := make(chan Size, 8)
	d := NewDebouncer(5*time.Millisecond, func(s Size) { got <- s }, DebouncerOptions{})
	defer d.Stop()
	d.Set(Size{80, 24})
	d.Set(Size{81, 24})
	d.Set(Size{82, 24})
	// On a loaded machine 81 may go out on its own; 80 is always first and
	// 82 always last.
	var seq []Size
	for len(seq) == 0 || seq[len(seq)-1] != (Size{82, 24}) {
		select {
		case s := <-got:
			seq = append(seq, s)
		case <-time.After(2 * time.Second):
			t.Fatalf("deliveries %v never reached 82x24", seq)
		}
	}
	if seq[0] != (Size{80, 24}) || len(seq) > 3 {
		t.Fatalf("deliveries = %v", seq)
	}
	select {
	case s := <-got:
		t.Fatalf("extra delivery %v after %v", s, seq)
	case <-time.After(20 * time.Millisecond):
	}
}
