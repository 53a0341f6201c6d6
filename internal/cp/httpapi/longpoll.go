package httpapi

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/wire/api"
)

// CodeNodeLongPollLimit is the refusal code of LongPolls.
const CodeNodeLongPollLimit = "node_long_poll_limit"

// longPollRetryAfter is the Retry-After (seconds) of node_long_poll_limit:
// a held long-poll ends within the long-poll's maximum wait, usually much
// sooner.
const longPollRetryAfter = 5

// LongPollWait is how long a long-poll asked to wait up to d waits before
// it answers that nothing came: a random time between 3/4 of d and d.
//
// Agents poll again as soon as a wait ends. With waits of one length, a
// fleet whose polls began together (every agent reconnecting after a
// restart of the control plane) would time out together at every wait,
// for ever: tens of thousands of answers and new polls in the same
// instant, each time. Random waits spread them over a quarter of the
// wait within a few rounds; Kubernetes' API server randomises its watch
// timeouts for the same reason.
func LongPollWait(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - rand.N(d/4+1)
}

// GivenUp is a long-poll's error err, unless the agent gave the request
// up meanwhile (its context ended, and the store read with it): then nil,
// as for a wait cancelled while it slept. Nobody is there to answer, and
// the error is not the server's to log.
func GivenUp(r *http.Request, err error) error {
	if err != nil && r.Context().Err() != nil {
		return nil
	}
	return err
}

// NodeHandler is a node route's handler after node authentication: it
// takes the caller's node id.
type NodeHandler = func(w http.ResponseWriter, r *http.Request, nodeID string) error

// NewLimitRefusals is the counter of requests refused by a per-node
// concurrency cap, by code (drover_limit_refusals_total), registered on
// reg. The long-poll caps and the terminal gateway share it.
func NewLimitRefusals(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_limit_refusals_total",
		Help: "Requests refused by a per-node concurrency cap, by code."}, []string{"code"})
	reg.MustRegister(c)
	return c
}

// LongPolls caps how many long-polls of one node route each node may hold
// open on this replica.
type LongPolls struct {
	slots    *Slots
	refusals *prometheus.CounterVec
}

// NewLongPolls returns the cap of route (a label of the
// drover_node_long_polls gauge, registered on reg) at limit per node;
// refusals counts what it refuses.
func NewLongPolls(route string, limit int, reg prometheus.Registerer, refusals *prometheus.CounterVec) *LongPolls {
	lp := &LongPolls{slots: NewSlots(limit), refusals: refusals}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_node_long_polls",
		Help:        "Node long-polls this replica holds open, by route.",
		ConstLabels: prometheus.Labels{"route": route}}, func() float64 { return float64(lp.slots.Count()) }))
	return lp
}

// Limit admits at most the limit of concurrent requests of one node to
// next; isPoll (nil: every request) picks the requests that count. Beyond
// the cap: 429 node_long_poll_limit with Retry-After. The cap is per
// replica. A request that next parks (Park) holds its slot until it
// finishes.
func (lp *LongPolls) Limit(isPoll func(*http.Request) bool, next NodeHandler) NodeHandler {
	return func(w http.ResponseWriter, r *http.Request, nodeID string) error {
		if isPoll != nil && !isPoll(r) {
			return next(w, r, nodeID)
		}
		release, ok := lp.slots.Acquire(nodeID)
		if !ok {
			return lp.refuse(nodeID)
		}
		defer releaseHeld(&release)
		return releaseOnFinish(next(w, r, nodeID), &release) // the long-poll parks below this frame: keep it small
	}
}

// releaseHeld is Limit's deferred release of its slot, unless
// releaseOnFinish took it over (nil).
//
//go:noinline
func releaseHeld(release *func()) {
	if *release != nil {
		(*release)()
	}
}

// releaseOnFinish passes err on; when it is a parked request's, it hands
// *release over to the request's end (Then), and clears it.
//
//go:noinline
func releaseOnFinish(err error, release *func()) error {
	if p, ok := ParkOf(err); ok {
		f := *release
		*release = nil
		p.Then(func(err error) error {
			f()
			return err
		})
	}
	return err
}

// refuse is Limit's 429, in a frame of its own so that Limit's stays small
// under a parked long-poll.
//
//go:noinline
func (lp *LongPolls) refuse(nodeID string) error {
	lp.refusals.WithLabelValues(CodeNodeLongPollLimit).Inc()
	return &Error{Status: http.StatusTooManyRequests, RetryAfter: longPollRetryAfter, CodedError: api.CodedError{
		Code: CodeNodeLongPollLimit,
		Message: fmt.Sprintf("node %q already holds %d open long-polls of this route on this replica; retry when one ends",
			nodeID, lp.slots.Limit())}}
}

// WaitRequested reports whether a request asks to wait (a positive ?wait=
// duration), as a desired-set long-poll does.
func WaitRequested(r *http.Request) bool {
	d, err := time.ParseDuration(r.URL.Query().Get("wait"))
	return err == nil && d > 0
}
