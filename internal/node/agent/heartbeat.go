package agent

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// heartbeatLoop reports liveness every interval (with ±5% jitter). On 429
// it slows down and reports edge_rate_limited instead of retrying harder.
func (a *Agent) heartbeatLoop(ctx context.Context) error {
	bo := newBackoff(time.Second, time.Minute)
	for {
		interval := a.heartbeatInterval()
		err := a.sendHeartbeat(ctx)
		var wait time.Duration
		switch {
		case err == nil:
			bo.reset()
			wait = interval + jitter(interval/10)
		case ctx.Err() != nil:
			return nil
		default:
			a.metrics.heartbeatFailures.WithLabelValues(failureReason(err)).Inc()
			wait = max(bo.next(), retryAfter(err))
			var ae *APIError
			if errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests {
				a.setDiagnostic("edge_rate_limited")
				wait = max(wait, 2*interval)
			}
			a.log.Warn("heartbeat failed", "err", err, "retry_in", wait.Round(time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func (a *Agent) heartbeatInterval() time.Duration {
	if a.cfg.HeartbeatInterval > 0 {
		return a.cfg.HeartbeatInterval
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.interval > 0 {
		return a.interval
	}
	if a.ident.HeartbeatInterval > 0 {
		return a.ident.HeartbeatInterval
	}
	return 5 * time.Second
}

func (a *Agent) sendHeartbeat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	capacity := a.capacity(ctx)
	hb := api.Heartbeat{AgentVersion: Version, Capacity: &capacity, Diagnostic: a.getDiagnostic()}
	resp, err := a.node.Heartbeat(ctx, a.node.node(), hb)
	if err != nil {
		return err
	}
	a.metrics.heartbeats.Inc()
	a.mu.Lock()
	a.lastBeat = a.now()
	if resp.HeartbeatInterval > 0 {
		a.interval = time.Duration(resp.HeartbeatInterval)
	}
	if a.diagnostic == "edge_rate_limited" {
		a.diagnostic = ""
	}
	a.mu.Unlock()
	return nil
}

// failureReason classifies an error for metrics and diagnostics using the
// preflight signal names.
func failureReason(err error) string {
	var ae *APIError
	if errors.As(err, &ae) {
		switch {
		case ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden:
			return "node_agent_auth_failed"
		case ae.Status == http.StatusTooManyRequests:
			return "edge_rate_limited"
		}
		return "http_" + http.StatusText(ae.Status)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return "node_agent_api_unreachable"
	}
	return "error"
}

func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}
