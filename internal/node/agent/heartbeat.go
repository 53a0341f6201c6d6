package agent

import (
	"context"
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
			reason := a.noteFailure(opHeartbeat, err)
			a.metrics.heartbeatFailures.WithLabelValues(reason).Inc()
			wait = max(bo.next(), retryAfter(err))
			if IsStatus(err, http.StatusTooManyRequests) {
				wait = max(wait, 2*interval) // slow down; never retry harder
			}
			a.log.Warn("heartbeat failed", "err", err, "signal", reason, "retry_in", wait.Round(time.Millisecond))
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
	a.checkDisk()
	capacity := a.capacity(ctx)
	hb := api.Heartbeat{AgentVersion: Version, Capacity: &capacity}
	// The current problem goes with the heartbeat; after an outage, the
	// first heartbeat that gets through reports it (since when, what was
	// seen) and the next one no longer does.
	hb.Diagnostic, hb.DiagnosticDetail, hb.CorrelationID, hb.DiagnosticSince = a.heartbeatDiagnostic()
	sent := a.now()
	resp, err := a.node.Heartbeat(ctx, a.node.node(), hb)
	if err != nil {
		return err
	}
	a.metrics.heartbeats.Inc()
	a.noteSuccess(opHeartbeat, sent)
	a.mu.Lock()
	a.lastBeat = a.now()
	if resp.HeartbeatInterval > 0 {
		a.interval = time.Duration(resp.HeartbeatInterval)
	}
	a.mu.Unlock()
	return nil
}

func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}
