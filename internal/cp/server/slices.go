package server

import (
	"context"
	"time"

	"github.com/drover-dev/drover/internal/cp/sliceflow"
	"github.com/drover-dev/drover/internal/cp/taskbus"
)

// resumeTimeout bounds the resume of the slice workflows at construction.
const resumeTimeout = 30 * time.Second

// wireSlices builds the slice workflow room (internal/cp/sliceflow), hands
// it to the allocations room, subscribes it to the results of
// slice.vm_provision and slice.vm_release, and resumes the workflows a
// previous run (or another replica) left unfinished. Resuming only
// records steps and queues tasks, so it is done before serving; a
// workflow it cannot resume (the store down) goes on at its next task
// event or at the next sweep (Serve runs the room's sweeper).
func (s *Server) wireSlices(b *taskbus.Bus) {
	room := sliceflow.New(s.store, s.tasks, s.audit, s.log, s.cfg.Now)
	s.sliceRoom = room
	s.allocs.SetSlices(room, sliceflow.Validate)
	room.Subscribe(b)
	ctx, cancel := context.WithTimeout(context.Background(), resumeTimeout)
	defer cancel()
	if err := room.Resume(ctx); err != nil {
		s.log.Warn("resume slice workflows", "err", err)
	}
}
