package server

import (
	"context"
	"encoding/json"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
)

// newTaskBus builds this replica's task event bus with its consumers
// subscribed by task type. The task path (deliver, taskResult, reapLoop)
// only publishes; a consumer of a new task type subscribes here.
//
// Delivery is synchronous, as the direct calls it replaced were: the
// terminal gateway is woken before the claimed task is written to the node,
// and an allocation's state has changed before the node's result is
// answered (tests and the CLI read it right after). Each event is published
// on the replica that made the transition; terminal sessions held by other
// replicas see it by re-reading the task from the store (pump.open).
func (s *Server) newTaskBus() *taskbus.Bus {
	b := taskbus.New()
	s.term.Subscribe(b)
	s.allocs.Subscribe(b)
	return b
}

// taskDispatched publishes that a node claimed t.
func (s *Server) taskDispatched(ctx context.Context, t store.Task) {
	s.tasks.PublishDispatched(ctx, taskbus.Dispatched{Task: t})
}

// taskFinished publishes that t reached a final state on this replica (a
// node's result, or the reaper's expiry).
func (s *Server) taskFinished(ctx context.Context, t store.Task) {
	e := taskbus.Finished{Task: t}
	if len(t.Result) > 0 {
		var res api.TaskResult
		if json.Unmarshal(t.Result, &res) == nil {
			e.Result = &res
		}
	}
	s.tasks.PublishFinished(ctx, e)
}
