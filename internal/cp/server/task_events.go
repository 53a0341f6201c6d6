package server

// subscribeTaskEvents subscribes the consumers of the task event bus
// (tasks.Room.Bus) by task type. The task path (tasks: deliver, Result,
// Reap) only publishes; a consumer of a new task type subscribes here.
//
// Delivery is synchronous, as the direct calls it replaced were: the
// terminal gateway is woken before the claimed task is written to the node,
// and an allocation's state has changed before the node's result is
// answered (tests and the CLI read it right after). Each event is published
// on the replica that made the transition; terminal sessions held by other
// replicas see it by re-reading the task from the store (pump.open).
func (s *Server) subscribeTaskEvents() {
	b := s.tasks.Bus()
	s.term.Subscribe(b)
	s.allocs.Subscribe(b)
	s.pre.Subscribe(b)
	s.health.Subscribe(b)
	s.wireSlices(b)
}
