package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/sdnotify"
)

// newFormatLogger is newLogger in format text or json (one object a line,
// for journald; the systemd unit sets DROVER_LOG_FORMAT=json).
func newFormatLogger(w io.Writer, level slog.Level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// runNotified is srv.Serve with sd_notify (systemd Type=notify; a no-op
// without NOTIFY_SOCKET): READY=1 once the store is open and both
// listeners accept connections, WATCHDOG=1 only while the operator
// listener answers /healthz, STOPPING=1 when shutdown begins.
func runNotified(ctx context.Context, srv *server.Server, cfg server.Config, log *slog.Logger,
	opLn, nodeLn net.Listener) error {
	n := sdnotify.New(log)
	if !n.Enabled() {
		return srv.Serve(ctx, opLn, nodeLn)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	status := fmt.Sprintf("serving: operator API on %s, node API at %s", cfg.OperatorAddr, srv.NodeURL())
	healthz := "http://" + dialable(cfg.OperatorAddr) + "/healthz"
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx, srv.Ready(), func() string { return status }, func(ctx context.Context) error {
			return answers(ctx, healthz)
		})
	}()
	n.Status("starting")
	err := srv.Serve(ctx, opLn, nodeLn)
	cancel()
	<-done
	return err
}

// dialable turns a listen address into one to dial: an unspecified host
// (":8080", "0.0.0.0:8080", "[::]:8080") is the loopback.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return net.JoinHostPort(host, port)
}

// answers GETs url (no proxy, no kept connection); any HTTP answer counts.
func answers(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("health check: %w", err)
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("operator listener does not answer: %w", err)
	}
	resp.Body.Close()
	return nil
}
