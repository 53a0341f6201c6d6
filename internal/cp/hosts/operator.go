package hosts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/instances"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// hostView converts a host record to its API form; secrets never leave.
func (s *Room) hostView(h store.Host) api.Host {
	v := api.Host{HeartbeatInterval: api.Duration(s.cfg.HeartbeatInterval),
		ID: h.ID, OSFamily: h.OSFamily, Labels: h.Labels, Enabled: h.Enabled, Revoked: h.Revoked, Draining: h.Draining,
		Status: h.Status, StatusReason: h.StatusReason, Hostname: h.Hostname, SelectedAccel: h.SelectedAccel,
		AgentVersion: h.AgentVersion, Enrolled: !h.EnrolledAt.IsZero(), CreatedAt: h.CreatedAt, UpdatedAt: h.UpdatedAt,
	}
	v.Schedulable = instances.Schedulable(h)
	if len(h.Capabilities) > 0 {
		var c api.Capabilities
		if json.Unmarshal(h.Capabilities, &c) == nil {
			v.Capabilities = &c
		}
	}
	if len(h.Capacity) > 0 {
		var c api.CapacityReport
		if json.Unmarshal(h.Capacity, &c) == nil {
			v.Capacity = &c
		}
	}
	tp := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	if h.TokenHash != "" && !h.TokenUsed {
		v.TokenExpiresAt = tp(h.TokenExpiresAt)
	}
	v.CertNotAfter, v.LastSeenAt = tp(h.CertNotAfter), tp(h.LastSeenAt)
	v.LastFailureSignal, v.LastFailureDetail = h.LastFailure.Signal, h.LastFailure.Detail
	v.LastFailureCorrelationID, v.LastFailureAt = h.LastFailure.CorrelationID, tp(h.LastFailure.At)
	v.LastSuccessfulPreflightAt = tp(h.LastSuccessfulPreflightAt)
	v.Profile.APIURL, v.Profile.TerminalURL = h.Profile.APIURL, h.Profile.TerminalURL
	v.Profile.ReportedAPIURL, v.Profile.ReportedTerminalURL = reportedURLs(h)
	v.Health, v.HealthSummary, v.HealthTaskID = h.Health.State, h.Health.Summary, h.Health.TaskID
	v.HealthCheckedAt = tp(h.Health.CheckedAt)
	return v
}

// List is GET /api/v1/hosts.
func (s *Room) List(w http.ResponseWriter, r *http.Request) error {
	hosts, err := s.store.ListHosts(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Host, 0, len(hosts))
	for _, h := range hosts {
		out = append(out, s.hostView(h))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// Show is GET /api/v1/hosts/{id}.
func (s *Room) Show(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	h, err := s.store.GetHost(r.Context(), id)
	if err != nil {
		return httpapi.StoreError(err, "host", id)
	}
	httpapi.WriteJSON(w, http.StatusOK, s.hostView(h))
	return nil
}

// Create (POST /api/v1/hosts) makes a host record and returns its bootstrap token once.
func (s *Room) Create(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var req api.CreateHostRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	var fields []api.FieldError
	if err := api.ValidHostID(req.HostID); err != nil {
		fields = append(fields, api.FieldError{Field: "host_id", Message: err.Error()})
	}
	if !api.ValidOSFamily(req.OSFamily) {
		fields = append(fields, api.FieldError{Field: "os_family", Message: "must be one of linux, dragonflybsd, windows, darwin"})
	}
	ttl := time.Duration(req.TokenTTL)
	if ttl == 0 {
		ttl = s.cfg.BootstrapTokenTTL
	} else if ttl < time.Minute || ttl > 30*24*time.Hour {
		fields = append(fields, api.FieldError{Field: "token_ttl", Message: "must be between 1m and 720h"})
	}
	fields = append(fields, api.ValidProfileURL("api_url", req.APIURL)...)
	fields = append(fields, api.ValidProfileURL("terminal_url", req.TerminalURL)...)
	if len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	now := s.cfg.Now().UTC()
	tok := httpapi.NewToken("drv_bt_")
	h := store.Host{ID: req.HostID, OSFamily: req.OSFamily, Labels: req.Labels, Enabled: true,
		Status: api.HostUnknown, TokenHash: httpapi.HashToken(tok), TokenExpiresAt: now.Add(ttl),
		CreatedAt: now, UpdatedAt: now, Profile: store.Profile{APIURL: req.APIURL, TerminalURL: req.TerminalURL}}
	// The host and its bootstrap token (a credential) are stored with
	// their records (ADR 0016).
	err := s.store.CreateHost(ctx, h,
		s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "host.create", Target: h.ID, Result: "ok", CID: httpapi.CorrelationID(ctx)}),
		s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "token.bootstrap_issue", Target: h.ID, Result: "ok",
			CID: httpapi.CorrelationID(ctx), Detail: "expires_at=" + h.TokenExpiresAt.Format(time.RFC3339)}))
	if err != nil {
		if errors.Is(err, store.ErrConflict) {
			return httpapi.Errorf(http.StatusConflict, "host_exists", "host %q already exists", req.HostID)
		}
		return err
	}
	httpapi.WriteJSON(w, http.StatusCreated, api.BootstrapToken{HostID: h.ID, Token: tok, ExpiresAt: h.TokenExpiresAt,
		CAHash: s.ca.Hash(), NodeURL: s.cfg.NodeURL})
	return nil
}

// mutateHost applies fn to a host, audits the action and returns the view.
func (s *Room) mutateHost(w http.ResponseWriter, r *http.Request, action string, fn func(*store.Host) error) error {
	ctx := r.Context()
	id := r.PathValue("id")
	cid := httpapi.CorrelationID(ctx)
	h, err := s.updateHost(ctx, id, func(h *store.Host) error {
		h.UpdatedAt = s.cfg.Now().UTC()
		return fn(h)
	}, func(before, after store.Host) []store.AuditEvent {
		// The operator's action, and the status transition it made.
		return append([]store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: action,
			Target: id, Result: "ok", CID: cid})}, s.auditStatus(ctx, after.StatusReason, cid)(before, after)...)
	})
	if err != nil {
		return httpapi.StoreError(err, "host", id)
	}
	httpapi.WriteJSON(w, http.StatusOK, s.hostView(h))
	return nil
}

// SetEnabled is enable and disable.
func (s *Room) SetEnabled(enabled bool) httpapi.HandlerFunc {
	action := "host.disable"
	if enabled {
		action = "host.enable"
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		return s.mutateHost(w, r, action, func(h *store.Host) error {
			h.Enabled = enabled
			return nil
		})
	}
}

// Revoke refuses the host's certificates and renewals from now on;
// enrolment with any token is refused with 403. Revocation is permanent for
// this host id. The host shows auth_failed from now on (never stale: the
// stale sweep skips revoked hosts), with the revocation as its last failure
// under the request's correlation id.
func (s *Room) Revoke(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	cid := httpapi.CorrelationID(ctx)
	var prev api.HostStatus
	err := s.mutateHost(w, r, "host.revoke", func(h *store.Host) error {
		prev = h.Status
		h.Revoked, h.Enabled = true, false
		h.Status, h.StatusReason = api.HostAuthFailed, "node_identity_revoked"
		h.LastFailure = store.Failure{Signal: string(signal.AuthFailed), Detail: "identity revoked by " + httpapi.Actor(ctx),
			CorrelationID: cid, At: s.cfg.Now().UTC()}
		return nil
	})
	if err == nil && prev != api.HostAuthFailed {
		s.statusChanged(r.PathValue("id"), prev, api.HostAuthFailed, "node_identity_revoked", cid)
	}
	return err
}

// RotateToken issues a fresh bootstrap token; the old one stops working.
func (s *Room) RotateToken(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	var req struct {
		TTL api.Duration `json:"token_ttl,omitempty"`
	}
	if r.ContentLength > 0 {
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			return err
		}
	}
	ttl := time.Duration(req.TTL)
	if ttl == 0 {
		ttl = s.cfg.BootstrapTokenTTL
	}
	tok := httpapi.NewToken("drv_bt_")
	now := s.cfg.Now().UTC()
	h, err := s.store.UpdateHostAudited(ctx, id, func(h *store.Host) error {
		if h.Revoked {
			return httpapi.Errorf(http.StatusConflict, "host_revoked", "host %q is revoked; create a new host record", id)
		}
		h.TokenHash, h.TokenUsed, h.TokenExpiresAt, h.UpdatedAt = httpapi.HashToken(tok), false, now.Add(ttl), now
		return nil
	}, func(_, h store.Host) []store.AuditEvent {
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "token.bootstrap_rotate",
			Target: id, Result: "ok", CID: httpapi.CorrelationID(ctx), Detail: "expires_at=" + h.TokenExpiresAt.Format(time.RFC3339)})}
	})
	if err != nil {
		return httpapi.StoreError(err, "host", id)
	}
	httpapi.WriteJSON(w, http.StatusOK, api.BootstrapToken{HostID: id, Token: tok, ExpiresAt: h.TokenExpiresAt,
		CAHash: s.ca.Hash(), NodeURL: s.cfg.NodeURL})
	return nil
}

// EnsureHost creates the host record if it is missing and, unless the host
// holds a certificate that is still valid, issues a fresh bootstrap token
// (returned; "" when none is needed). `drover dev` uses it for its local
// agent.
func (s *Room) EnsureHost(ctx context.Context, id, osFamily string) (string, error) {
	now := s.cfg.Now().UTC()
	err := s.store.CreateHost(ctx, store.Host{ID: id, OSFamily: osFamily, Enabled: true, Status: api.HostUnknown,
		CreatedAt: now, UpdatedAt: now})
	if err != nil && !errors.Is(err, store.ErrConflict) {
		return "", err
	}
	tok := httpapi.NewToken("drv_bt_")
	_, err = s.store.UpdateHostAudited(ctx, id, func(h *store.Host) error {
		if h.Revoked {
			return fmt.Errorf("host %q is revoked; use another --host-id", id)
		}
		if now.Before(h.CertNotAfter) {
			tok = ""
			return errNoChange
		}
		h.TokenHash, h.TokenUsed, h.TokenExpiresAt = httpapi.HashToken(tok), false, now.Add(time.Hour)
		return nil
	}, func(store.Host, store.Host) []store.AuditEvent {
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: "system", Action: "token.bootstrap_issue", Target: id,
			Result: "ok", Detail: "drover dev"})}
	})
	if errors.Is(err, errNoChange) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return tok, nil
}

// errNoChange aborts an UpdateHost without writing.
var errNoChange = errors.New("no change")

// SetDraining is drain and undrain: a draining host takes no new
// instances, and its agent learns it from its desired set.
func (s *Room) SetDraining(on bool) httpapi.HandlerFunc {
	action := "host.undrain"
	if on {
		action = "host.drain"
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		err := s.mutateHost(w, r, action, func(h *store.Host) error {
			h.Draining = on
			return nil
		})
		if err == nil {
			s.instances.Wake(r.PathValue("id"))
		}
		return err
	}
}
