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
// best-effort: a full channel drops events.
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
		err := r.follow(sctx, res, ch, func() { wait = eventsBackoffMin })
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

// follow reads one connection's events; connected is called on the first.
func (r *Runtime) follow(ctx context.Context, res client.EventsResult, ch chan runtime.Event, connected func()) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-res.Err:
			if err == nil {
				err = errors.New("stream closed")
			}
			return err
		case m := <-res.Messages:
			connected()
			id := m.Actor.Attributes[LabelInstance]
			if id == "" {
				continue
			}
			at := time.Unix(0, m.TimeNano)
			var ev runtime.Event
			switch m.Action {
			case events.ActionStart:
				ev = runtime.Event{ID: id, Kind: runtime.EventStarted, At: at}
			case events.ActionDie:
				r.forgetReady(id)
				ev = runtime.Event{ID: id, Kind: runtime.EventExited, At: at, State: runtime.StateCrashed}
				if ins, err := r.inspect(ctx, "events", id); err == nil {
					st := r.status(ins)
					ev.State, ev.Reason, ev.Detail = st.State, st.ExitReason, st.ExitDetail
				}
			default:
				continue
			}
			r.mu.Lock()
			select {
			case ch <- ev:
			default:
			}
			r.mu.Unlock()
		}
	}
}
