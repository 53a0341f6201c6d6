package instances

import (
	"net/http"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

// desiredParked is NodeDesired on a transport that parks requests. Its
// first read runs on the handler's goroutine, as NodeDesired's, with its
// waiter (a callback, httpapi.ParkedWait) registered before; only a wait
// NodeDesired would sleep in parks, and the handler returns. The poll
// holds no goroutine until its wake, its timer or its request's end fires
// and starts one, which re-reads and answers as NodeDesired's select does
// (desiredPoll's ParkedRoute methods).
//
//go:noinline
func (s *Room) desiredParked(w http.ResponseWriter, r *http.Request, nodeID string) error {
	wait, etag, err := desiredParams(r)
	if err != nil {
		return err
	}
	if etag == "" || wait == 0 { // it answers at once: no waiter, no poll
		set, revoked, err := s.desiredSet(r.Context(), nodeID)
		if err != nil {
			return err
		}
		return answerDesired(w, set, revoked)
	}
	dp := &desiredPoll{s: s, w: w, r: r}
	dp.Start(dp, s.waiters, nodeID)
	set, revoked, err := s.desiredSet(r.Context(), nodeID)
	if err != nil || revoked || set.ETag != etag {
		dp.Stop()
		if err != nil {
			return err
		}
		return answerDesired(w, set, revoked)
	}
	dp.set = set
	return dp.Park(w, wait)
}

// desiredPoll is a parked desired-set wait: all it keeps while it waits,
// besides the request and the callbacks armed for it. Its node is the
// ParkedWait's.
type desiredPoll struct {
	httpapi.ParkedWait
	s   *Room
	w   http.ResponseWriter
	r   *http.Request
	set api.NodeInstances // the last set read; its ETag is the request's ?etag=
}

// Woken re-reads the set: done (answered) when its ETag changed or the
// node was revoked; else the poll keeps the fresh set and waits on.
func (dp *desiredPoll) Woken() (bool, error) {
	set, revoked, err := dp.s.desiredSet(dp.r.Context(), dp.Node())
	if err != nil {
		return true, httpapi.GivenUp(dp.r, err)
	}
	if !revoked && set.ETag == dp.set.ETag {
		dp.set = set
		return false, nil
	}
	return true, answerDesired(dp.w, set, revoked)
}

// TimedOut answers the last set read (its ETag unchanged), as
// NodeDesired does when its timer fires.
func (dp *desiredPoll) TimedOut() error { return answerDesired(dp.w, dp.set, false) }
