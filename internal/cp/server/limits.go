package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/hosts"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/prometheus/client_golang/prometheus"
)

// Refusal codes of the per-node concurrency caps.
const (
	codeNodeLongPollLimit = "node_long_poll_limit"
	// longPollRetryAfter is the Retry-After (seconds) of node_long_poll_limit:
	// a held long-poll ends within MaxWait, usually much sooner.
	longPollRetryAfter = 5
)

// setLimitDefaults fills the listener limits and the per-node caps.
func (c *Config) setLimitDefaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.ReadHeaderTimeout, 10*time.Second)
	def(&c.BodyReadTimeout, 30*time.Second)
	def(&c.IdleTimeout, 2*time.Minute)
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = 64 << 10
	}
	if c.NodeLongPollLimit == 0 {
		c.NodeLongPollLimit = 4
	}
	if c.Terminal.MaxSessionsPerNode == 0 {
		c.Terminal.MaxSessionsPerNode = 16
	}
	def(&c.Terminal.RecheckInterval, 30*time.Second)
	switch {
	case c.ReadHeaderTimeout < 0, c.BodyReadTimeout < 0, c.IdleTimeout < 0:
		return fmt.Errorf("HTTP timeouts must not be negative (read header %s, body %s, idle %s)",
			c.ReadHeaderTimeout, c.BodyReadTimeout, c.IdleTimeout)
	case c.MaxHeaderBytes < 4<<10:
		return fmt.Errorf("max header bytes %d: must be at least 4096", c.MaxHeaderBytes)
	case c.NodeLongPollLimit < 1:
		return fmt.Errorf("node long-poll limit %d: must be at least 1", c.NodeLongPollLimit)
	case c.Terminal.MaxSessionsPerNode < 1:
		return fmt.Errorf("terminal sessions per node %d: must be at least 1", c.Terminal.MaxSessionsPerNode)
	case c.Terminal.RecheckInterval < 0:
		return fmt.Errorf("terminal recheck interval %s: must not be negative", c.Terminal.RecheckInterval)
	}
	return nil
}

// httpServer is the http.Server of one listener. ReadHeaderTimeout also
// bounds the TLS handshake; ReadTimeout bounds headers plus body. net/http
// clears the read deadline once a request's body has been read (at once
// for requests without one, such as long-polls and WebSocket upgrades) and
// when a connection is hijacked, so those stay open as long as their
// handlers want. There is deliberately no WriteTimeout: it would end
// long-polls and WebSockets.
func (s *Server) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadHeaderTimeout + s.cfg.BodyReadTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// longPolls holds the long-poll slots of each node route.
type longPolls struct {
	tasks, instances *httpapi.Slots
}

func newLongPolls(limit int, reg *prometheus.Registry) *longPolls {
	lp := &longPolls{tasks: httpapi.NewSlots(limit), instances: httpapi.NewSlots(limit)}
	for route, slots := range map[string]*httpapi.Slots{"tasks": lp.tasks, "instances": lp.instances} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_node_long_polls",
			Help:        "Node long-polls this replica holds open, by route.",
			ConstLabels: prometheus.Labels{"route": route}}, func() float64 { return float64(slots.Count()) }))
	}
	return lp
}

// nodeHandler is a node route behind nodeAuth.
type nodeHandler = func(w http.ResponseWriter, r *http.Request, c hosts.Caller) error

// limitLongPolls admits at most Config.NodeLongPollLimit concurrent
// requests of one node through slots; isPoll (nil: every request) picks the
// requests that count. Beyond the cap: 429 node_long_poll_limit with
// Retry-After. The cap is per replica.
func (s *Server) limitLongPolls(slots *httpapi.Slots, isPoll func(*http.Request) bool, next nodeHandler) nodeHandler {
	return func(w http.ResponseWriter, r *http.Request, c hosts.Caller) error {
		if isPoll != nil && !isPoll(r) {
			return next(w, r, c)
		}
		release, ok := slots.Acquire(c.ID)
		if !ok {
			s.metrics.limitRefusals.WithLabelValues(codeNodeLongPollLimit).Inc()
			return &httpapi.Error{Status: http.StatusTooManyRequests, Code: codeNodeLongPollLimit, RetryAfter: longPollRetryAfter,
				Msg: fmt.Sprintf("node %q already holds %d open long-polls of this route on this replica; retry when one ends",
					c.ID, slots.Limit())}
		}
		defer release()
		return next(w, r, c)
	}
}

// instancesLongPoll reports whether a desired-set request asks to wait.
func instancesLongPoll(r *http.Request) bool {
	d, err := time.ParseDuration(r.URL.Query().Get("wait"))
	return err == nil && d > 0
}
