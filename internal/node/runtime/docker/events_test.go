package docker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// fakeExits is an engine's answers to the exit inspects: per id, the exit
// code and whether the engine has marked the container OOMKilled (set by
// its oom event, which may trail the die event).
type fakeExits struct {
	mu   sync.Mutex
	code map[string]int
	oom  map[string]bool
}

func (f *fakeExits) inspect(_ context.Context, id string, at time.Time) (runtime.Event, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := runtime.Event{ID: id, Kind: runtime.EventExited, At: at, State: runtime.StateCrashed}
	if f.oom[id] {
		ev.Reason = api.ReasonOOMKilled
	}
	return ev, f.code[id] == 137 && !f.oom[id]
}

func (f *fakeExits) markOOM(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.oom[id] = true
}

// TestExitWaitsForTrailingOOM: the engine's die event can come before its
// oom event (CI saw exit 137 with OOMKilled false); a SIGKILLed exit is
// held until the oom event, the container's next event or oomGrace, and
// an exit that is not a SIGKILL is never held.
func TestExitWaitsForTrailingOOM(t *testing.T) {
	type msg struct {
		id     string
		action events.Action
	}
	cases := []struct {
		name string
		code map[string]int
		msgs []msg
		end  bool            // the stream ends after msgs
		want []runtime.Event // in order, At ignored
	}{
		{"oom after die", map[string]int{"a": 137},
			[]msg{{"a", events.ActionDie}, {"a", events.ActionOOM}}, false,
			[]runtime.Event{{ID: "a", Kind: runtime.EventExited, State: runtime.StateCrashed, Reason: api.ReasonOOMKilled}}},
		{"no oom: released after the grace", map[string]int{"a": 137},
			[]msg{{"a", events.ActionDie}}, false,
			[]runtime.Event{{ID: "a", Kind: runtime.EventExited, State: runtime.StateCrashed}}},
		{"a crash is not held", map[string]int{"a": 1, "b": 0},
			[]msg{{"a", events.ActionDie}, {"b", events.ActionStart}}, false,
			[]runtime.Event{{ID: "a", Kind: runtime.EventExited, State: runtime.StateCrashed}, {ID: "b", Kind: runtime.EventStarted}}},
		{"held exit goes before its container's start", map[string]int{"a": 137},
			[]msg{{"a", events.ActionDie}, {"a", events.ActionStart}}, false,
			[]runtime.Event{{ID: "a", Kind: runtime.EventExited, State: runtime.StateCrashed}, {ID: "a", Kind: runtime.EventStarted}}},
		{"others pass a held exit", map[string]int{"a": 137, "b": 1},
			[]msg{{"a", events.ActionDie}, {"b", events.ActionDie}, {"a", events.ActionOOM}}, false,
			[]runtime.Event{{ID: "b", Kind: runtime.EventExited, State: runtime.StateCrashed}, {ID: "a", Kind: runtime.EventExited, State: runtime.StateCrashed, Reason: api.ReasonOOMKilled}}},
		{"the stream ends: the held exit is released", map[string]int{"a": 137},
			[]msg{{"a", events.ActionDie}}, true,
			[]runtime.Event{{ID: "a", Kind: runtime.EventExited, State: runtime.StateCrashed}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := &fakeExits{code: c.code, oom: map[string]bool{}}
			r := &Runtime{ready: map[string]*readyState{}}
			msgs, errs := make(chan events.Message), make(chan error)
			out := make(chan runtime.Event, 16)
			done := make(chan error, 1)
			go func() {
				done <- r.follow(ctx, client.EventsResult{Messages: msgs, Err: errs}, out, func() {}, f.inspect)
			}()
			for _, m := range c.msgs {
				if m.action == events.ActionOOM {
					f.markOOM(m.id) // the engine flags the container, then logs the event
				}
				msgs <- events.Message{Action: m.action, Actor: events.Actor{Attributes: map[string]string{LabelInstance: m.id}}}
			}
			if c.end {
				errs <- nil
			}
			for i, want := range c.want {
				select {
				case got := <-out:
					got.At = time.Time{}
					if got != want {
						t.Fatalf("event %d: %+v, want %+v", i, got, want)
					}
				case <-time.After(oomGrace + 5*time.Second):
					t.Fatalf("event %d: none, want %+v", i, want)
				}
			}
			if !c.end {
				errs <- nil
			}
			if err := <-done; err == nil {
				t.Fatal("follow returned nil when the stream closed")
			}
			select {
			case ev := <-out:
				t.Fatalf("unexpected event %+v", ev)
			default:
			}
		})
	}
}
