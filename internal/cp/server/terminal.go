package server

import (
	"context"
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// nodeOnline reports whether a node's agent is heard from and allowed in.
func (s *Server) nodeOnline(ctx context.Context, id string) bool {
	hs, err := s.hosts.get(ctx, id)
	if err != nil || hs.revoked || !hs.enabled {
		return false
	}
	switch hs.status {
	case api.HostStale, api.HostUnknown, api.HostAuthFailed, "":
		return false
	}
	return true
}

// onlineFunc adapts nodeOnline to termgw.Nodes.
type onlineFunc func(ctx context.Context, id string) bool

func (f onlineFunc) NodeOnline(ctx context.Context, id string) bool { return f(ctx, id) }

// enqueueFunc adapts enqueue to termgw.Tasks.
type enqueueFunc func(ctx context.Context, t store.Task) error

func (f enqueueFunc) Enqueue(ctx context.Context, t store.Task) error { return f(ctx, t) }

// taskQueue adapts newTask and enqueue to the rooms' Tasks interfaces.
type taskQueue struct{ s *Server }

func (q taskQueue) New(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task {
	return q.s.newTask(ctx, nodeID, typ, params, ttl)
}

func (q taskQueue) Enqueue(ctx context.Context, t store.Task) error { return q.s.enqueue(ctx, t) }

// instanceFinder adapts findInstance to allocations.Instances.
type instanceFinder struct{ s *Server }

func (f instanceFinder) Find(ctx context.Context, ref string) (store.Instance, error) {
	return f.s.findInstance(ctx, ref)
}
