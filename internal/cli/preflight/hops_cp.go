package preflight

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// allocationBinding: the allocation is active and bound to the node; it
// names the node when --node-id was not given.
func (r *run) allocationBinding(ctx context.Context, res *preflight.HopResult) {
	if r.cfg.AllocationID == "" {
		res.Status, res.Detail = preflight.Skipped, "no --allocation-id"
		return
	}
	var a api.Allocation
	if err := r.api.do(ctx, http.MethodGet, "/api/v1/allocations/"+url.PathEscape(r.cfg.AllocationID), nil, &a); err != nil {
		res.Fail(failSignal(err, signal.AllocationNotReady), "read the allocation: "+err.Error())
		return
	}
	r.alloc = &a
	host := a.HostID
	if host == "" && a.InstanceID != "" {
		var in api.Instance
		if err := r.api.do(ctx, http.MethodGet, "/api/v1/instances/"+url.PathEscape(a.InstanceID), nil, &in); err != nil {
			res.Fail(failSignal(err, signal.AllocationNotReady), fmt.Sprintf("read the allocation's instance %s: %v", a.InstanceID, err))
			return
		}
		host = in.HostID
	}
	res.Data = map[string]any{"state": string(a.State), "kind": string(a.Kind), "host_id": host}
	if a.InstanceID != "" {
		res.Data["instance_id"] = a.InstanceID
	}
	if a.State != api.AllocationActive {
		detail := fmt.Sprintf("allocation %s is %s, not active", a.ID, a.State)
		if a.StateReason != "" {
			detail += " (" + a.StateReason + ")"
		}
		res.Fail(signal.AllocationNotReady, detail)
		return
	}
	switch {
	case host == "":
		res.Fail(signal.AllocationNotReady, fmt.Sprintf("allocation %s is bound to no host", a.ID))
		return
	case r.cfg.NodeID == "":
		r.cfg.NodeID, r.report.NodeID = host, host
	case r.cfg.NodeID != host:
		res.Fail(signal.AllocationNotReady, fmt.Sprintf("allocation %s is bound to host %s, not --node-id %s", a.ID, host, r.cfg.NodeID))
		return
	}
	res.Detail = fmt.Sprintf("allocation %s is active on host %s", a.ID, host)
}

// nodeHeartbeat: the host's status is not stale or unknown and its
// last_seen is recent. auth_failed, api_unreachable and task_result_failed
// are reported at their own hops.
func (r *run) nodeHeartbeat(ctx context.Context, res *preflight.HopResult) {
	var h api.Host
	if err := r.api.do(ctx, http.MethodGet, "/api/v1/hosts/"+url.PathEscape(r.cfg.NodeID), nil, &h); err != nil {
		res.Fail(failSignal(err, signal.HeartbeatStale), "read the host: "+err.Error())
		return
	}
	r.host = &h
	res.Data = map[string]any{"status": string(h.Status)}
	if h.LastSeenAt != nil {
		res.Data["last_seen_at"] = h.LastSeenAt.UTC().Format(time.RFC3339Nano)
	}
	if h.AgentVersion != "" {
		res.Data["agent_version"] = h.AgentVersion
	}
	if h.Health != "" { // the last diag.health_probe (node_recovery_status fails when unhealthy)
		res.Data["health"], res.Data["health_summary"], res.Data["health_task_id"] = string(h.Health), h.HealthSummary, h.HealthTaskID
		if h.HealthCheckedAt != nil {
			res.Data["health_checked_at"] = h.HealthCheckedAt.UTC().Format(time.RFC3339Nano)
		}
	}
	reason := ""
	if h.StatusReason != "" {
		reason = " (" + h.StatusReason + ")"
	}
	interval := time.Duration(h.HeartbeatInterval)
	if interval <= 0 { // a control plane that does not say: the flag's value
		interval = r.cfg.HeartbeatInterval
	}
	window := 4 * interval
	switch {
	case h.Revoked || h.Status == api.HostAuthFailed:
		// The agent may well be running: its requests are refused. That
		// is node_recovery_status's finding (node_agent_auth_failed).
		res.Detail = fmt.Sprintf("host %s is %s%s: its identity is refused (see node_recovery_status)", h.ID, h.Status, reason)
	case h.Status == api.HostStale || h.Status == api.HostUnknown || h.Status == "":
		res.Fail(signal.HeartbeatStale, fmt.Sprintf("host %s is %s%s", h.ID, orUnknown(string(h.Status)), reason))
	case h.LastSeenAt == nil:
		res.Fail(signal.HeartbeatStale, fmt.Sprintf("host %s was never heard from", h.ID))
	case r.cfg.Now().Sub(*h.LastSeenAt) > window:
		res.Fail(signal.HeartbeatStale, fmt.Sprintf("host %s last seen %s ago (more than %s)", h.ID,
			r.cfg.Now().Sub(*h.LastSeenAt).Round(time.Second), window))
	default:
		res.Detail = fmt.Sprintf("host %s is %s%s, last seen %s ago", h.ID, h.Status, reason,
			r.cfg.Now().Sub(*h.LastSeenAt).Round(time.Millisecond))
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// nodeRecoveryStatus: the host is not auth_failed or task_result_failed,
// and a diag.health_probe is claimed and its result posted in time.
func (r *run) nodeRecoveryStatus(ctx context.Context, res *preflight.HopResult) {
	if r.host != nil {
		switch {
		case r.host.Revoked:
			res.Fail(signal.AuthFailed, fmt.Sprintf("host %s is revoked: its identity is refused for good (re-enrol it as a new host)", r.host.ID))
			return
		case r.host.Status == api.HostAuthFailed:
			res.Fail(signal.AuthFailed, fmt.Sprintf("host %s is auth_failed: %s", r.host.ID, r.host.StatusReason))
			return
		case r.host.Status == api.HostTaskResultFailed:
			res.Fail(signal.TaskResultPostFailed, fmt.Sprintf("host %s is task_result_failed: %s", r.host.ID, r.host.StatusReason))
			return
		}
	}
	params, _ := json.Marshal(task.HealthProbeParams{})
	req := api.EnqueueTaskRequest{NodeID: r.cfg.NodeID, Type: task.TypeHealthProbe, Params: params,
		TTL: api.Duration(max(r.cfg.Timeout, 2*time.Second)), CorrelationID: r.report.CorrelationID}
	var t api.Task
	if err := r.api.do(ctx, http.MethodPost, "/api/v1/tasks", req, &t); err != nil {
		res.Fail(failSignal(err, signal.TaskClaimFailed), "queue diag.health_probe: "+err.Error())
		return
	}
	res.Data = map[string]any{"task_id": t.ID}
	for !t.State.Terminal() {
		left := time.Until(deadlineOf(ctx)) - 200*time.Millisecond
		if left <= 0 {
			break
		}
		wait := min(left, time.Minute).Round(time.Millisecond)
		var next api.Task
		path := fmt.Sprintf("/api/v1/tasks/%s?wait=%s", url.PathEscape(t.ID), wait)
		if err := r.api.do(ctx, http.MethodGet, path, nil, &next); err != nil {
			if ctx.Err() != nil {
				break
			}
			res.Fail(failSignal(err, signal.TaskResultPostFailed), fmt.Sprintf("read task %s: %v", t.ID, err))
			return
		}
		t = next
	}
	res.Data["state"] = string(t.State)
	switch t.State {
	case api.TaskQueued, api.TaskExpired:
		r.cancelTask(t.ID)
		res.Fail(signal.TaskClaimFailed, fmt.Sprintf("diag.health_probe task %s was not claimed within %s (%s)", t.ID, r.cfg.Timeout, t.State))
	case api.TaskDispatched, api.TaskRunning:
		res.Fail(signal.TaskResultPostFailed, fmt.Sprintf("diag.health_probe task %s was claimed but no result came within %s (%s)", t.ID, r.cfg.Timeout, t.State))
	case api.TaskCanceled:
		res.Fail(signal.TaskClaimFailed, fmt.Sprintf("diag.health_probe task %s was canceled", t.ID))
	case api.TaskFailed:
		if n, detail := diskSignal(t.Result); n != "" {
			res.Fail(n, fmt.Sprintf("diag.health_probe task %s: %s", t.ID, detail))
			return
		}
		msg := "no error"
		if t.Result != nil && t.Result.Error != nil {
			msg = t.Result.Error.Code + ": " + t.Result.Error.Message
		}
		res.Fail(signal.TaskResultPostFailed, fmt.Sprintf("diag.health_probe task %s failed: %s", t.ID, msg))
	default: // succeeded
		if n, detail := diskSignal(t.Result); n != "" {
			res.Fail(n, fmt.Sprintf("diag.health_probe task %s: %s", t.ID, detail))
			return
		}
		if h := r.host; h != nil && h.Health == api.HealthUnhealthy {
			// The host's recorded health (a scheduled or earlier probe):
			// the agent answers, but the host failed a check.
			res.Fail(signal.HealthProbeUnhealthy, fmt.Sprintf("host %s is unhealthy since its health probe %s: %s (this run's probe: task %s)",
				h.ID, h.HealthTaskID, h.HealthSummary, t.ID))
			return
		}
		res.Detail = fmt.Sprintf("diag.health_probe task %s claimed and its result posted", t.ID)
	}
}

// cancelTask cancels a task preflight gave up on, best effort.
func (r *run) cancelTask(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.api.do(ctx, http.MethodPost, "/api/v1/tasks/"+url.PathEscape(id)+"/cancel", nil, nil)
}

func deadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(time.Minute)
}

// probeOutput is the part of diag.health_probe's output preflight reads.
type probeOutput struct {
	RootFS struct {
		Path        string  `json:"path"`
		UsedPercent float64 `json:"used_percent"`
		Full        bool    `json:"full"`
	} `json:"root_fs"`
	DiagnosticPath struct {
		Path     string `json:"path"`
		Writable bool   `json:"writable"`
		Error    string `json:"error"`
	} `json:"diagnostic_path"`
	Checks []struct {
		Reason string `json:"reason"`
		Detail string `json:"detail"`
	} `json:"checks"`
}

// diskSignal finds a full or pressured disk in a health probe's result.
func diskSignal(res *api.TaskResult) (signal.Name, string) {
	if res == nil {
		return "", ""
	}
	if res.Error != nil {
		switch signal.Name(res.Error.Code) {
		case signal.DiskFull, signal.DiskPressure:
			return signal.Name(res.Error.Code), res.Error.Message
		}
		if strings.Contains(res.Error.Message, "no space left on device") {
			return signal.DiskFull, res.Error.Message
		}
	}
	var out probeOutput
	if len(res.Output) == 0 || json.Unmarshal(res.Output, &out) != nil {
		return "", ""
	}
	for _, c := range out.Checks {
		switch signal.Name(c.Reason) {
		case signal.DiskFull, signal.DiskPressure:
			return signal.Name(c.Reason), c.Detail
		}
	}
	if out.RootFS.Full {
		return signal.DiskFull, fmt.Sprintf("%s is full: %.1f%% used", out.RootFS.Path, out.RootFS.UsedPercent)
	}
	if !out.DiagnosticPath.Writable && strings.Contains(out.DiagnosticPath.Error, "no space left on device") {
		return signal.DiskFull, fmt.Sprintf("diagnostic path %s: %s", out.DiagnosticPath.Path, out.DiagnosticPath.Error)
	}
	return "", ""
}

// terminalTokenMint mints a terminal token for the allocation.
func (r *run) terminalTokenMint(ctx context.Context, res *preflight.HopResult) {
	if r.cfg.AllocationID == "" {
		res.Status, res.Detail = preflight.Skipped, "no --allocation-id"
		return
	}
	var tok api.TerminalToken
	err := r.api.do(ctx, http.MethodPost, "/api/v1/allocations/"+url.PathEscape(r.cfg.AllocationID)+"/terminal-token",
		api.TerminalTokenRequest{Cols: 80, Rows: 24}, &tok)
	if err != nil {
		res.Fail(failSignal(err, signal.TokenMintFailed), "mint a terminal token: "+err.Error())
		var ae *apiError
		if errors.As(err, &ae) {
			res.Data = map[string]any{"http_status": ae.Status, "code": ae.Code, "correlation_id": ae.CorrelationID}
		}
		return
	}
	r.token = &tok
	res.Data = map[string]any{"session_id": tok.SessionID}
	res.Detail = fmt.Sprintf("token minted for session %s (expires %s)", tok.SessionID, tok.ExpiresAt.UTC().Format(time.RFC3339))
}

// terminalPublicRoute: {terminal-base}/healthz answers 200. The root is not
// probed: an edge may legitimately answer 404 there.
func (r *run) terminalPublicRoute(ctx context.Context, res *preflight.HopResult) {
	u := r.cfg.TerminalBase + "/healthz"
	res.Data = map[string]any{"url": u}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		res.Fail(signal.PublicRouteMissing, err.Error())
		return
	}
	req.Header.Set(api.HeaderCorrelationID, r.report.CorrelationID)
	resp, err := r.cfg.HTTPClient.Do(req)
	if err != nil {
		res.Fail(signal.PublicRouteMissing, fmt.Sprintf("GET %s: %v", u, err))
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	res.Data["http_status"] = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		res.Fail(signal.PublicRouteMissing, fmt.Sprintf("GET %s: HTTP %d, want 200", u, resp.StatusCode))
		return
	}
	res.Detail = fmt.Sprintf("GET %s: HTTP 200", u)
}
