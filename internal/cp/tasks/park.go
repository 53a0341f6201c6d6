package tasks

import (
	"net/http"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

// waitParked is Wait on a transport that parks requests. Its waiter is a
// callback (httpapi.ParkedWait) and its first claim runs on the handler's
// goroutine, as Wait's; then the request parks and the handler returns.
// The poll holds no goroutine until its wake, its timer or its request's
// end fires and starts one, which claims and answers as Wait's select
// does (poll's ParkedRoute methods).
//
//go:noinline
func (s *Room) waitParked(w http.ResponseWriter, r *http.Request, nodeID string) error {
	wait, max, err := s.waitParams(r)
	if err != nil {
		return err
	}
	pl := &poll{s: s, w: w, r: r, max: uint8(max)}
	pl.Start(pl, s.waiters, nodeID)
	if delivered, err := s.firstClaim(w, r, nodeID, max); delivered || err != nil {
		pl.Stop()
		return err
	}
	return pl.Park(w, wait)
}

// poll is a parked wait: all it keeps while it waits, besides the request
// and the callbacks armed for it. Its node is the ParkedWait's.
type poll struct {
	httpapi.ParkedWait
	s   *Room
	w   http.ResponseWriter
	r   *http.Request
	max uint8 // at most api.MaxClaim
}

const _ = uint8(api.MaxClaim) // poll.max holds it

// Woken is a woken poll's claim (claimOnWake): done when it delivered.
func (pl *poll) Woken() (bool, error) {
	return pl.s.claimOnWake(pl.w, pl.r, pl.Node(), int(pl.max))
}

// TimedOut answers a poll whose time is up and no wake is pending for:
// 204, and its node is quiet unless a wake came since (while it looked).
func (pl *poll) TimedOut() error {
	pl.s.waiters.SettleUnless(pl.Node(), pl.WakePending)
	pl.w.WriteHeader(http.StatusNoContent)
	return nil
}
