package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"
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
