package server

// Adapters between the server's parts not yet in rooms and the interfaces
// the rooms declare.

import (
	"net/http"

	"github.com/drover-dev/drover/internal/cp/hosts"
)

// nodeIDHandler adapts a room's node handler, which takes the caller's node
// id, to the node API's authenticated handlers.
func nodeIDHandler(h func(w http.ResponseWriter, r *http.Request, nodeID string) error) nodeHandler {
	return func(w http.ResponseWriter, r *http.Request, c hosts.Caller) error { return h(w, r, c.ID) }
}
