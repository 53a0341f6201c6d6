package server

// Adapters between the server's parts not yet in rooms and the interfaces
// the rooms declare.

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

// taskQueue adapts newTask and enqueue to the rooms' Tasks interfaces.
type taskQueue struct{ s *Server }

func (q taskQueue) New(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task {
	return q.s.newTask(ctx, nodeID, typ, params, ttl)
}

func (q taskQueue) Enqueue(ctx context.Context, t store.Task) error { return q.s.enqueue(ctx, t) }

// nodeIDHandler adapts a room's node handler, which takes the caller's node
// id, to the node API's authenticated handlers.
func nodeIDHandler(h func(w http.ResponseWriter, r *http.Request, nodeID string) error) nodeHandler {
	return func(w http.ResponseWriter, r *http.Request, c nodeCaller) error { return h(w, r, c.id) }
}
