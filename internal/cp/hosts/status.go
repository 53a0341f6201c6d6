package hosts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// maxFailureDetail bounds a stored failure detail.
const maxFailureDetail = 1024

// observation is what one heartbeat says about its host: the status it
// should have, the reason shown with it, and the failure it reports.
type observation struct {
	status  api.HostStatus
	reason  string
	cid     string
	failure store.Failure // zero when the agent reported nothing
	// agentCID is true when the failure's correlation id is the agent's
	// own (else it is the heartbeat request's).
	agentCID bool
}

// newFailure reports whether o's failure is not the one already stored.
func (o observation) newFailure(hs hostState) bool { return o.differs(hs.failure) }

// differs reports whether o carries a failure other than stored: another
// signal, or another correlation id the agent named. A problem the agent
// reports without an id gets each request's id, which must not make every
// heartbeat of a degraded host a store write.
func (o observation) differs(stored store.Failure) bool {
	return o.failure.Signal != "" && (o.failure.Signal != stored.Signal ||
		(o.agentCID && o.failure.CorrelationID != stored.CorrelationID))
}

// diagnosticSignal maps a heartbeat's Diagnostic to its signal. Agents
// before the signal table reported the result-post failure under its short
// name (legacyResultPostFailed).
func diagnosticSignal(d string) (signal.Signal, bool) {
	if d == legacyResultPostFailed {
		d = string(signal.TaskResultPostFailed)
	}
	return signal.Lookup(signal.Name(d))
}

// legacyResultPostFailed is the Diagnostic older agents send for
// signal.TaskResultPostFailed.
const legacyResultPostFailed = "task_result_post_failed"

// observe classifies a heartbeat: a clean one makes the host healthy; a
// signal the agent reports gives the host that signal's status (healthy for
// signals that name no status) and becomes its last failure. cid is the
// request's correlation id, used when the agent names none.
func observe(hb api.Heartbeat, cid string, now time.Time) observation {
	o := observation{status: api.HostHealthy, cid: cid}
	if hb.Diagnostic == "" {
		return o
	}
	sig, ok := diagnosticSignal(hb.Diagnostic)
	if !ok { // not in the vocabulary: nothing the control plane can name
		return o
	}
	if hb.CorrelationID != "" && httpapi.ValidCorrelationID(hb.CorrelationID) {
		o.cid, o.agentCID = hb.CorrelationID, true
	}
	if sig.HostStatus != "" {
		o.status, o.reason = sig.HostStatus, string(sig.Name)
	}
	at := now
	if hb.DiagnosticSince != nil && !hb.DiagnosticSince.IsZero() && hb.DiagnosticSince.Before(now) {
		at = hb.DiagnosticSince.UTC()
	}
	o.failure = store.Failure{Signal: string(sig.Name), Detail: bounded(hb.DiagnosticDetail), CorrelationID: o.cid, At: at}
	return o
}

func bounded(s string) string {
	if len(s) > maxFailureDetail {
		return s[:maxFailureDetail]
	}
	return s
}

// markAuthFailed records authenticated evidence that the host's identity
// is not to be used: a certificate the CA issued to it refused because a
// later enrolment superseded it, or a revoked host's agent still calling.
// Anonymous failures (a wrong bootstrap token) never change a host's status.
func (s *Room) markAuthFailed(ctx context.Context, id, reason string) {
	var prev api.HostStatus
	cid := httpapi.CorrelationID(ctx)
	now := s.cfg.Now().UTC()
	_, err := s.updateHost(ctx, id, func(h *store.Host) error {
		prev = h.Status
		h.Status, h.StatusReason = api.HostAuthFailed, reason
		h.LastFailure = store.Failure{Signal: string(signal.AuthFailed), Detail: reason, CorrelationID: cid, At: now}
		return nil
	}, s.auditStatus(ctx, reason, cid))
	if err == nil {
		if prev != api.HostAuthFailed {
			s.statusChanged(id, prev, api.HostAuthFailed, reason, cid)
		}
	}
}

// sameURL compares two URLs as an operator means them (no trailing slash,
// case-insensitive scheme and host).
func sameURL(a, b string) bool {
	return strings.EqualFold(strings.TrimRight(a, "/"), strings.TrimRight(b, "/"))
}

// profileDrift says how the URLs the agent reports differ from the host's
// profile; "" when they match or cannot be compared.
func profileDrift(p store.Profile, reportedAPI, reportedTerm string) string {
	var d []string
	if p.APIURL != "" && reportedAPI != "" && !sameURL(p.APIURL, reportedAPI) {
		d = append(d, fmt.Sprintf("api_url: profile %s, agent %s", p.APIURL, reportedAPI))
	}
	if p.TerminalURL != "" && reportedTerm != "" && !sameURL(p.TerminalURL, reportedTerm) {
		d = append(d, fmt.Sprintf("terminal_url: profile %s, agent %s", p.TerminalURL, reportedTerm))
	}
	return strings.Join(d, "; ")
}

// checkProfile compares h's profile with what its agent reports
// (reportedAPI, reportedTerm): a mismatch becomes h's last failure
// (terminal_env_profile_drift), a match clears a drift failure. The status
// is left as heartbeats make it. It returns what changed ("" for nothing,
// "drift" or "cleared").
func checkProfile(h *store.Host, reportedAPI, reportedTerm, cid string, now time.Time) string {
	drift := profileDrift(h.Profile, reportedAPI, reportedTerm)
	isDrift := h.LastFailure.Signal == string(signal.EnvProfileDrift)
	switch {
	case drift != "" && (!isDrift || h.LastFailure.Detail != drift):
		h.LastFailure = store.Failure{Signal: string(signal.EnvProfileDrift), Detail: drift, CorrelationID: cid, At: now}
		return "drift"
	case drift == "" && isDrift:
		h.LastFailure = store.Failure{}
		return "cleared"
	}
	return ""
}

// driftRecords is the audit record of a profile drift found or cleared
// (none for no change), for the store to write with the change.
func (s *Room) driftRecords(ctx context.Context, actor, id, change string, h store.Host) []store.AuditEvent {
	if change == "" {
		return nil
	}
	return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: actor, Action: "host.profile_drift", Target: id,
		Result: change, CID: httpapi.CorrelationID(ctx), Detail: h.LastFailure.Detail})}
}

// SetProfile is POST /api/v1/hosts/{id}/profile: it replaces the host's
// environment profile and checks it against what the agent reports.
func (s *Room) SetProfile(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	var req api.HostProfileRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	fields := append(api.ValidProfileURL("api_url", req.APIURL), api.ValidProfileURL("terminal_url", req.TerminalURL)...)
	if len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	now := s.cfg.Now().UTC()
	var change string
	h, err := s.updateHost(ctx, id, func(h *store.Host) error {
		h.Profile = store.Profile{APIURL: req.APIURL, TerminalURL: req.TerminalURL}
		h.UpdatedAt = now
		capsAPI, capsTerm := reportedURLs(*h)
		change = checkProfile(h, capsAPI, capsTerm, httpapi.CorrelationID(ctx), now)
		return nil
	}, func(_, after store.Host) []store.AuditEvent {
		return append([]store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "host.profile",
			Target: id, Result: "ok", CID: httpapi.CorrelationID(ctx),
			Detail: "api_url=" + req.APIURL + " terminal_url=" + req.TerminalURL})},
			s.driftRecords(ctx, httpapi.Actor(ctx), id, change, after)...)
	})
	if err != nil {
		return httpapi.StoreError(err, "host", id)
	}
	httpapi.WriteJSON(w, http.StatusOK, s.hostView(h))
	return nil
}

// PreflightOutcome is what a stored preflight run says about its host.
type PreflightOutcome struct {
	HostID, RunID, CorrelationID string
	OK                           bool
	// NodeAPIFailed is set when the node-side hop
	// node_runtime_api_reachability failed, with its signal and detail.
	NodeAPIFailed bool
	Signal        string
	Detail        string
}

// RecordPreflight applies a stored preflight run to its host: a run that
// passed sets last_successful_preflight_at; a failed node-side
// node_runtime_api_reachability hop on a stale host makes it
// api_unreachable (more specific than stale) with the run's correlation id.
// Unknown hosts are ignored.
func (s *Room) RecordPreflight(ctx context.Context, o PreflightOutcome) error {
	now := s.cfg.Now().UTC()
	var prev, to api.HostStatus
	reason := "preflight " + o.RunID + ": " + o.Signal
	_, err := s.updateHost(ctx, o.HostID, func(h *store.Host) error {
		prev, to = h.Status, h.Status
		switch {
		case o.OK:
			h.LastSuccessfulPreflightAt = now
		case o.NodeAPIFailed:
			h.LastFailure = preflightFailure(*h, o, now)
			if h.Status == api.HostStale && !h.Revoked {
				to = api.HostAPIUnreachable
				h.Status, h.StatusReason = to, preflightReasonPrefix+string(signal.HopNodeRuntimeAPIReachability)
			}
		default:
			return errNoChange
		}
		return nil
	}, s.auditStatus(ctx, reason, o.CorrelationID))
	switch {
	case errors.Is(err, errNoChange) || errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	if prev != to {
		s.statusChanged(o.HostID, prev, to, reason, o.CorrelationID)
	}
	return nil
}

// preflightFailure is the last failure a failed node-side
// node_runtime_api_reachability hop of a run stored at now gives h. While
// the same failure persists (the stored last failure has the run's signal,
// the host has not been healthy since, and no run has passed since) its
// time stays the first occurrence's: last_failure_at says since when the
// host fails, not when a run last confirmed it. The detail and correlation
// id are the run's, so they lead to its stored report.
func preflightFailure(h store.Host, o PreflightOutcome, now time.Time) store.Failure {
	f := store.Failure{Signal: o.Signal, Detail: bounded(o.Detail), CorrelationID: o.CorrelationID, At: now}
	prev := h.LastFailure
	if prev.Signal == o.Signal && !prev.At.IsZero() && !prev.At.After(now) &&
		h.Status != api.HostHealthy && h.LastSuccessfulPreflightAt.Before(prev.At) {
		f.At = prev.At
	}
	return f
}

// preflightReasonPrefix starts the status reason a preflight run sets; the
// store's stale sweep leaves such an api_unreachable host alone (it has not
// heartbeated, and preflight named why).
const preflightReasonPrefix = store.PreflightStatusReasonPrefix

// reportedURLs are the URLs h's agent last reported in its capabilities.
func reportedURLs(h store.Host) (apiURL, terminalURL string) {
	if len(h.Capabilities) == 0 {
		return "", ""
	}
	var c api.Capabilities
	if json.Unmarshal(h.Capabilities, &c) != nil {
		return "", ""
	}
	return c.ControlPlaneURL, c.TerminalURL
}
