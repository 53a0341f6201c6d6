package server

// Adapters between the server's parts not yet in rooms and the interfaces
// the rooms declare.

import (
	"context"
	"net/http"
)

// nodeState answers the rooms' questions about a node from the host
// cache: termgw.Nodes and tasks.Nodes.
type nodeState struct{ s *Server }

func (n nodeState) NodeOnline(ctx context.Context, id string) bool { return n.s.nodeOnline(ctx, id) }

func (n nodeState) NodeRevoked(ctx context.Context, id string) (bool, error) {
	hs, err := n.s.hosts.get(ctx, id)
	if err != nil {
		return false, err
	}
	return hs.revoked, nil
}

// nodeIDHandler adapts a room's node handler, which takes the caller's node
// id, to the node API's authenticated handlers.
func nodeIDHandler(h func(w http.ResponseWriter, r *http.Request, nodeID string) error) nodeHandler {
	return func(w http.ResponseWriter, r *http.Request, c nodeCaller) error { return h(w, r, c.id) }
}
