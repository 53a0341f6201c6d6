package docker

import (
	"context"
	"errors"
	"time"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Reconnect back-off of the engine's event stream.
const (
	eventsBackoffMin = 100 * time.Millisecond
	eventsBackoffMax = 5 * time.Second
)

// Subscribe delivers the instances' events until ctx ends: started and
// exited from the engine's /events stream (filtered by the instance
// label; reconnected with back-off when the engine restarts), ready from
// the readiness watchers, progress from image pulls. Delivery is
// best-effort: a full channel drops events. An exit by SIGKILL can come
// up to oomGrace late: it waits for the engine's oom event.
func (r *Runtime) Subscribe(ctx context.Context) <-chan runtime.Event {
	ch := make(chan runtime.Event, 64)
	r.mu.Lock()
	r.subs[ch] = struct{}{}
	r.mu.Unlock()
	go func() {
		r.streamEvents(ctx, ch)
		r.mu.Lock()
		delete(r.subs, ch)
		close(ch)
		r.mu.Unlock()
	}()
	return ch
}

// emit sends ev to every subscriber that has room.
func (r *Runtime) emit(ev runtime.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ch := range r.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// streamEvents follows the engine's events into ch until ctx ends.
func (r *Runtime) streamEvents(ctx context.Context, ch chan runtime.Event) {
	wait := eventsBackoffMin
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		res := r.cli.Events(sctx, client.EventsListOptions{Filters: client.Filters{}.
			Add("type", string(events.ContainerEventType)).Add("label", LabelInstance)})
		err := r.follow(sctx, res, ch, func() { wait = eventsBackoffMin }, r.exitEvent)
		cancel()
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("container engine event stream ended; reconnecting", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, eventsBackoffMax)
	}
}

// oomGrace is how long an exit by SIGKILL (code 137) that the engine has
// not marked OOMKilled waits for the engine's oom event. The oom event
// usually comes 20–60 ms before the die event, but both travel separately
// from containerd's shim, and on a loaded host the die can come first: the
// exit would then be reported as a plain crash and the OOM lost.
const oomGrace = 2 * time.Second

// exitInspector builds an instance's exited event from its container, and
// says whether it was SIGKILLed without the engine's OOM flag.
type exitInspector func(ctx context.Context, id string, at time.Time) (ev runtime.Event, killed bool)

// follow reads one connection's events; connected is called on the first.
// A SIGKILLed exit is held until its oom event, the next event of its
// container, or oomGrace, whichever is first, and then inspected again.
func (r *Runtime) follow(ctx context.Context, res client.EventsResult, ch chan runtime.Event, connected func(), inspect exitInspector) error {
	held := map[string]heldExit{}
	release := func(id string) {
		if h, ok := held[id]; ok {
			delete(held, id)
			ev, _ := inspect(ctx, id, h.at)
			r.send(ch, ev)
		}
	}
	timer := time.NewTimer(oomGrace) // reset before each use (Go 1.23 timers hold no stale tick)
	defer timer.Stop()
	for {
		var due <-chan time.Time
		if len(held) > 0 {
			timer.Reset(time.Until(firstDue(held)))
			due = timer.C
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-res.Err:
			for id := range held { // the engine went away: report what it said
				release(id)
			}
			if err == nil {
				err = errors.New("stream closed")
			}
			return err
		case now := <-due:
			for id, h := range held {
				if !now.Before(h.until) {
					release(id)
				}
			}
		case m := <-res.Messages:
			connected()
			id := m.Actor.Attributes[LabelInstance]
			if id == "" {
				continue
			}
			release(id) // its oom event, or a later event: the exit goes first
			at := time.Unix(0, m.TimeNano)
			switch m.Action {
			case events.ActionStart:
				r.send(ch, runtime.Event{ID: id, Kind: runtime.EventStarted, At: at})
			case events.ActionDie:
				r.forgetReady(id)
				ev, killed := inspect(ctx, id, at)
				if killed {
					held[id] = heldExit{at: at, until: time.Now().Add(oomGrace)}
					continue
				}
				r.send(ch, ev)
			}
		}
	}
}

// heldExit is a SIGKILLed exit waiting for its oom event.
type heldExit struct{ at, until time.Time }

// firstDue is the earliest time a held exit is released.
func firstDue(held map[string]heldExit) time.Time {
	var first time.Time
	for _, h := range held {
		if first.IsZero() || h.until.Before(first) {
			first = h.until
		}
	}
	return first
}

// exitEvent is an instance's exited event from its container as the engine
// reports it now (crashed with no detail when the inspect fails).
func (r *Runtime) exitEvent(ctx context.Context, id string, at time.Time) (runtime.Event, bool) {
	ev := runtime.Event{ID: id, Kind: runtime.EventExited, At: at, State: runtime.StateCrashed}
	ins, err := r.inspect(ctx, "events", id)
	if err != nil {
		return ev, false
	}
	st := r.status(ins)
	ev.State, ev.Reason, ev.Detail = st.State, st.ExitReason, st.ExitDetail
	killed := ins.State != nil && ins.State.ExitCode == 137 && !ins.State.OOMKilled && st.State == runtime.StateCrashed
	return ev, killed
}

// send delivers ev to ch when it has room.
func (r *Runtime) send(ch chan runtime.Event, ev runtime.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case ch <- ev:
	default:
	}
}
