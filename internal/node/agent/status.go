package agent

import (
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/drover-dev/drover/internal/node/probe"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// Status is the agent's status document: what /healthz answers, what
// `drover-agent status` prints and what diag.collect returns.
type Status struct {
	// Status is ok, not_enrolled, node_agent_heartbeat_stale, or degraded
	// (Signal names the problem).
	Status          string      `json:"status"`
	NodeID          string      `json:"node_id"`
	Enrolled        bool        `json:"enrolled"`
	Version         string      `json:"version"`
	ControlPlaneURL string      `json:"control_plane_url"`
	Signal          signal.Name `json:"signal,omitempty"`
	// Diagnostic repeats Signal (the field's older name).
	Diagnostic          string     `json:"diagnostic,omitempty"`
	Detail              string     `json:"detail,omitempty"`
	Since               *time.Time `json:"since,omitempty"`
	CorrelationID       string     `json:"correlation_id,omitempty"`
	SpooledResults      int        `json:"spooled_results"`
	DiskPath            string     `json:"disk_path,omitempty"`
	DiskUsedPercent     float64    `json:"disk_used_percent"`
	DiskPressurePercent int        `json:"disk_pressure_percent"`
	LastHeartbeatAt     *time.Time `json:"last_heartbeat_at,omitempty"`
}

// Status builds the status document; ok is false when there is a problem.
func (a *Agent) Status() (Status, bool) {
	a.mu.Lock()
	last, enrolled, disk := a.lastBeat, a.ident.NodeID != "", a.disk
	a.mu.Unlock()
	st := Status{NodeID: a.nodeID, Enrolled: enrolled, Version: Version, ControlPlaneURL: a.cfg.ControlPlaneURL,
		SpooledResults: int(a.spooled.Load()), DiskPath: disk.Path, DiskUsedPercent: roundPercent(disk.UsedPercent),
		DiskPressurePercent: a.cfg.diskPressurePercent()}
	if !last.IsZero() {
		t := last.UTC()
		st.LastHeartbeatAt = &t
	}
	if n, p, ok := a.diag.current(); ok {
		st.Signal, st.Diagnostic, st.Detail, st.CorrelationID = n, string(n), p.detail, p.cid
		since := p.since
		st.Since = &since
	}
	switch {
	case !enrolled:
		st.Status = "not_enrolled"
	case last.IsZero() || a.now().Sub(last) > 3*a.heartbeatInterval():
		st.Status = string(signal.HeartbeatStale)
	case st.Signal != "":
		st.Status = "degraded"
	default:
		st.Status = "ok"
	}
	return st, st.Status == "ok"
}

func roundPercent(p float64) float64 { return float64(int(p*10+0.5)) / 10 }

// cpTarget is the control plane's host:port, for failure details.
func (a *Agent) cpTarget() string {
	u, err := url.Parse(a.cfg.ControlPlaneURL)
	if err != nil {
		return a.cfg.ControlPlaneURL
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return u.Host
}

// noteFailure classifies a failed request of op, records it as the
// agent's diagnostic and returns the metric reason (the signal, or
// "other" for answers that are not outages).
func (a *Agent) noteFailure(op string, err error) string {
	f, ok := probe.Classify(err, a.cpTarget())
	if !ok {
		return "other"
	}
	a.diag.report(f.Signal, op, op+": "+f.Detail, f.CorrelationID)
	return string(f.Signal)
}

// connectivity are the signals a successful request disproves.
func connectivity(n signal.Name) bool {
	switch n {
	case signal.APIUnreachable, signal.APITLSFailed, signal.AuthFailed, signal.EdgeRateLimited, signal.BinaryInvalid:
		return true
	}
	return false
}

// noteSuccess ends, when a request of op sent at sent got through, the
// connectivity problems op saw and those no request has seen since sent.
// Only heartbeats call it: the heartbeat that carried an outage's report
// is the one that ends it, so the first heartbeat after an outage always
// names it, whichever request saw it last.
func (a *Agent) noteSuccess(op string, sent time.Time) {
	a.diag.clearIf(func(n signal.Name, p problem) bool {
		return connectivity(n) && (p.op == op || p.seen.Before(sent))
	})
}

// noteWrite records a failed write to the state dir: disk_full on ENOSPC.
func (a *Agent) noteWrite(what string, err error) {
	if err == nil {
		if a.diag.has(signal.DiskFull) {
			a.diag.clearIf(func(n signal.Name, p problem) bool { return n == signal.DiskFull && p.op == opWrite })
		}
		return
	}
	if probe.IsDiskFull(err) {
		a.diag.report(signal.DiskFull, opWrite, what+": "+err.Error(), "")
	}
}

// checkDisk measures the state dir's filesystem: disk_full at 100%,
// node_observability_disk_pressure at or above the threshold. Entering
// pressure, the agent first frees its own buffers (the older half of its
// diagnostic events and log lines).
func (a *Agent) checkDisk() {
	u, err := probe.Usage(a.cfg.StateDir)
	if err != nil {
		a.log.Debug("disk usage", "err", err)
		return
	}
	a.mu.Lock()
	a.disk = u
	a.mu.Unlock()
	th := a.cfg.diskPressurePercent()
	detail := func() string {
		return "state dir " + u.Path + " filesystem " + formatPercent(u.UsedPercent) + " used (threshold " + formatPercent(float64(th)) + ")"
	}
	if u.UsedPercent >= 100 || (u.TotalBytes > 0 && u.FreeBytes == 0) {
		a.diag.report(signal.DiskFull, opDisk, detail(), "")
	} else {
		a.diag.clearIf(func(n signal.Name, p problem) bool { return n == signal.DiskFull })
	}
	if u.UsedPercent < float64(th) {
		a.diag.clear(signal.DiskPressure)
		return
	}
	if !a.diag.has(signal.DiskPressure) {
		events, lines := a.diag.shrink(), a.logs.shrink()
		a.log.Warn("disk pressure: dropped the older half of the agent's diagnostic buffers",
			"used_percent", roundPercent(u.UsedPercent), "threshold_percent", th, "events_dropped", events, "log_lines_dropped", lines)
	}
	a.diag.report(signal.DiskPressure, opDisk, detail(), "")
}

func formatPercent(p float64) string {
	return slogValue(roundPercent(p)) + "%"
}

func slogValue(v any) string { return slog.AnyValue(v).String() }

// countSpooled refreshes the number of results waiting in the spool.
func (a *Agent) countSpooled() int {
	pending, err := a.state.Pending()
	if err != nil {
		return int(a.spooled.Load())
	}
	a.spooled.Store(int64(len(pending)))
	return len(pending)
}

// heartbeatDiagnostic fills a heartbeat's diagnostic fields.
func (a *Agent) heartbeatDiagnostic() (name, detail, cid string, since *time.Time) {
	n, p, ok := a.diag.current()
	if !ok {
		return "", "", "", nil
	}
	s := p.since
	return string(n), p.detail, p.cid, &s
}
