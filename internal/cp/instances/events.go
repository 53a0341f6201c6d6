package instances

import (
	"context"
	"net/http"
	"strconv"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// defaultEventsLimit is GET .../events' page without ?limit=.
const defaultEventsLimit = 100

// eventOf is the event of a status transition of in (as it now is) by
// actor.
func (s *Room) eventOf(ctx context.Context, in store.Instance, actor, message string) store.InstanceEvent {
	return store.InstanceEvent{InstanceID: in.ID, At: s.now().UTC(), Phase: in.Phase, ReasonCode: in.ReasonCode,
		Message: message, DesiredState: in.DesiredState, Generation: in.Generation,
		ObservedGeneration: in.ObservedGeneration, Actor: actor, CorrelationID: httpapi.CorrelationID(ctx)}
}

// eventView converts a stored event to its API form.
func eventView(ev store.InstanceEvent) api.InstanceEvent {
	return api.InstanceEvent{InstanceID: ev.InstanceID, Seq: ev.Seq, At: ev.At, Phase: ev.Phase, ReasonCode: ev.ReasonCode,
		Message: ev.Message, DesiredState: ev.DesiredState, Generation: ev.Generation,
		ObservedGeneration: ev.ObservedGeneration, Actor: ev.Actor, CorrelationID: ev.CorrelationID}
}

// Events is GET /api/v1/instances/{id}/events: the instance's last
// ?limit= (default 100, at most store.MaxInstanceEvents) status transitions,
// oldest first.
func (s *Room) Events(w http.ResponseWriter, r *http.Request) error {
	limit := defaultEventsLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.MaxInstanceEvents {
			return httpapi.Invalid([]api.FieldError{{Field: "limit",
				Message: "must be 1 to " + strconv.Itoa(store.MaxInstanceEvents)}})
		}
		limit = n
	}
	in, err := s.Find(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	evs, err := s.store.ListInstanceEvents(r.Context(), in.ID, limit)
	if err != nil {
		return err
	}
	out := make([]api.InstanceEvent, 0, len(evs))
	for _, ev := range evs {
		out = append(out, eventView(ev))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
