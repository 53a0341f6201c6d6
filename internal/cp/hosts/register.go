package hosts

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// errTokenRefused is the one answer to a known host's registration whose
// bootstrap token is not proven: a wrong token, a used or rotated-out one,
// none outstanding, or none at all look alike, so the answer tells nothing
// about the host (enrolled or not, disabled, revoked). Its message names no
// host id.
func errTokenRefused() *httpapi.Error {
	return httpapi.Errorf(http.StatusUnauthorized, "bootstrap_token_invalid",
		"bootstrap token refused: it is wrong, expired or already used; an operator issues a new one with `drover hosts rotate-token`")
}

// Register enrols a host with its bootstrap token and signs its CSR.
//
// Only a valid bootstrap token (or, with AllowUnknownHostRegistration, the
// creation of a host record that did not exist) enrols. An anonymous
// failure never changes the host: it is counted, audited with its source
// address and rate limited per source and per host id.
func (s *Room) Register(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	if ok, after := s.limiter.Allow(r); !ok {
		s.metrics.Registrations.WithLabelValues("rate_limited").Inc()
		return &httpapi.Error{Status: http.StatusTooManyRequests, RetryAfter: after,
			CodedError: api.CodedError{Code: "rate_limited", Message: "too many registration attempts; retry later"}}
	}
	req, fields, err := api.DecodeRegister(io.LimitReader(r.Body, httpapi.MaxBody))
	if err != nil {
		s.metrics.Registrations.WithLabelValues("invalid").Inc()
		return httpapi.Errorf(http.StatusUnprocessableEntity, "invalid_json", "register payload: %v", err)
	}
	if len(fields) > 0 {
		s.metrics.Registrations.WithLabelValues("invalid").Inc()
		return httpapi.Invalid(fields)
	}
	failKeys := []string{"source:" + httpapi.LimitKey(r.RemoteAddr), "host:" + req.HostID}
	if blocked, after := s.authFails.blocked(failKeys...); blocked {
		s.metrics.Registrations.WithLabelValues("rate_limited").Inc()
		return &httpapi.Error{Status: http.StatusTooManyRequests, RetryAfter: after,
			CodedError: api.CodedError{Code: "rate_limited", Message: "too many failed registration attempts; retry later"}}
	}
	now := s.cfg.Now().UTC()
	src := sourceAddr(r)
	if req.PreviousCertificate != nil {
		return s.reenrol(ctx, w, req, src, failKeys, now)
	}
	if _, err := s.store.GetHost(ctx, req.HostID); errors.Is(err, store.ErrNotFound) {
		if !s.cfg.AllowUnknownHostRegistration {
			s.registerFailed(ctx, req.HostID, src, failKeys, "unknown_host")
			return httpapi.Errorf(http.StatusNotFound, "unknown_host", "host %q has no host record; create it with `drover hosts create`", req.HostID)
		}
		ident, created, err := s.registerUnknown(ctx, req, src, now)
		if err != nil {
			return err
		}
		if created {
			httpapi.WriteJSON(w, http.StatusOK, ident)
			return nil
		}
		// Created by someone else meanwhile: a known host, token required.
	} else if err != nil {
		return err
	}

	var ident api.Identity
	presented := httpapi.HashToken(req.BootstrapToken)
	var drift string // a profile drift found or cleared
	h, err := s.updateHost(ctx, req.HostID, func(h *store.Host) error {
		// Only after the token is proven may the answer say anything about
		// the host: its token's expiry, revocation, disablement.
		if h.TokenHash == "" || h.TokenUsed || subtle.ConstantTimeCompare([]byte(presented), []byte(h.TokenHash)) != 1 {
			return errTokenRefused()
		}
		if !now.Before(h.TokenExpiresAt) {
			return httpapi.Errorf(http.StatusUnauthorized, "bootstrap_token_expired", "bootstrap token expired at %s; rotate it", h.TokenExpiresAt.Format(time.RFC3339))
		}
		var err error
		if ident, drift, err = s.enrolProven(ctx, h, req, now); err != nil {
			return err
		}
		h.TokenHash, h.TokenUsed = "", true
		return nil
	}, func(_, after store.Host) []store.AuditEvent {
		return append([]store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: "node:" + after.ID, Action: "host.register",
			Target: after.ID, Result: "ok", CID: httpapi.CorrelationID(ctx),
			Detail: "cert_serial=" + after.CertSerial + " source=" + src})},
			s.driftRecords(ctx, "node:"+after.ID, after.ID, drift, after)...)
	})
	return s.registered(ctx, w, req.HostID, src, failKeys, h, ident, err)
}

// enrolProven enrols h, whose agent proved its credential (a bootstrap
// token or its previous certificate), inside the host's update: refused
// when the host is revoked or disabled or reports another OS family;
// otherwise a new certificate for the CSR, issued now, supersedes every
// earlier one (EnrolledAt). drift is the profile drift found or cleared.
func (s *Room) enrolProven(ctx context.Context, h *store.Host, req api.RegisterRequest, now time.Time) (ident api.Identity, drift string, err error) {
	if h.Revoked {
		return ident, "", httpapi.Errorf(http.StatusForbidden, "host_revoked", "host %q is revoked", h.ID)
	}
	if !h.Enabled {
		return ident, "", httpapi.Errorf(http.StatusForbidden, "host_disabled", "host %q is disabled; enable it with `drover hosts enable %s`", h.ID, h.ID)
	}
	if h.OSFamily != req.Capabilities.OSFamily {
		return ident, "", httpapi.Invalid([]api.FieldError{{Field: "capabilities.os_family",
			Message: fmt.Sprintf("os_family %q does not match the host record (%q)", req.Capabilities.OSFamily, h.OSFamily)}})
	}
	certPEM, serial, notAfter, err := s.ca.SignNodeCSR([]byte(req.CSRPEM), h.ID, s.cfg.CertTTL, now)
	if err != nil {
		return ident, "", httpapi.Invalid([]api.FieldError{{Field: "csr_pem", Message: err.Error()}})
	}
	h.CertSerial, h.CertNotAfter, h.EnrolledAt = serial, notAfter, now
	setReported(h, req.Capabilities)
	drift = checkProfile(h, req.Capabilities.ControlPlaneURL, req.Capabilities.TerminalURL, httpapi.CorrelationID(ctx), now)
	return s.identity(h.ID, certPEM, notAfter), drift, nil
}

// registered ends a registration of hostID whose host update returned h
// and err: a 401 is an anonymous failure (counted, audited with the
// source, rate limited); any other refusal is audited as the node's; a
// success (its host already cached by updateHost) answers ident.
func (s *Room) registered(ctx context.Context, w http.ResponseWriter, hostID, src string, failKeys []string,
	h store.Host, ident api.Identity, err error) error {
	if err != nil {
		var he *httpapi.Error
		if errors.As(err, &he) && he.Status == http.StatusUnauthorized {
			s.registerFailed(ctx, hostID, src, failKeys, he.Code)
			return err
		}
		result := "error"
		if he != nil {
			result = he.Code
		}
		s.metrics.Registrations.WithLabelValues(result).Inc()
		s.audit.Record(ctx, audit.Entry{Actor: "node:" + hostID, Action: "host.register", Target: hostID,
			Result: result, CID: httpapi.CorrelationID(ctx), Detail: "source=" + src})
		return err
	}
	s.metrics.Registrations.WithLabelValues("ok").Inc()
	httpapi.Logger(ctx, s.log).Info("host enrolled", "host_id", h.ID, "cert_not_after", h.CertNotAfter, "source", src)
	httpapi.WriteJSON(w, http.StatusOK, ident)
	return nil
}

// registerUnknown enrols a host id that has no record, without a token
// (AllowUnknownHostRegistration): the CSR is signed first and the record is
// inserted already enrolled, so the insert is what decides. created is
// false when the id got a record meanwhile; the caller then requires a
// token like for any known host.
func (s *Room) registerUnknown(ctx context.Context, req api.RegisterRequest, src string, now time.Time) (api.Identity, bool, error) {
	certPEM, serial, notAfter, err := s.ca.SignNodeCSR([]byte(req.CSRPEM), req.HostID, s.cfg.CertTTL, now)
	if err != nil {
		s.metrics.Registrations.WithLabelValues("invalid_payload").Inc()
		return api.Identity{}, false, httpapi.Invalid([]api.FieldError{{Field: "csr_pem", Message: err.Error()}})
	}
	h := store.Host{ID: req.HostID, OSFamily: req.Capabilities.OSFamily, Enabled: true, Status: api.HostUnknown,
		TokenUsed: true, CertSerial: serial, CertNotAfter: notAfter, EnrolledAt: now, CreatedAt: now, UpdatedAt: now}
	setReported(&h, req.Capabilities)
	unlock := s.cache.lockWrite(h.ID)
	// An enrolment without a token is stored with its records (ADR 0016).
	err = s.store.CreateHost(ctx, h,
		s.audit.Event(ctx, audit.Entry{Actor: "node:" + h.ID, Action: "host.create", Target: h.ID,
			Result: "unknown_host_registration", CID: httpapi.CorrelationID(ctx), Detail: "source=" + src}),
		s.audit.Event(ctx, audit.Entry{Actor: "node:" + h.ID, Action: "host.register", Target: h.ID, Result: "ok",
			CID: httpapi.CorrelationID(ctx), Detail: "cert_serial=" + serial + " source=" + src + " unknown_host_registration"}))
	if err == nil {
		s.cache.put(h)
	}
	unlock()
	if errors.Is(err, store.ErrConflict) {
		return api.Identity{}, false, nil
	} else if err != nil {
		return api.Identity{}, false, err
	}
	s.metrics.Registrations.WithLabelValues("unknown_host_registration").Inc()
	httpapi.Logger(ctx, s.log).Warn("unknown host enrolled without a bootstrap token", "host_id", h.ID, "source", src)
	return s.identity(h.ID, certPEM, notAfter), true, nil
}

// setReported copies what the agent reports at enrolment onto the record.
func setReported(h *store.Host, caps api.Capabilities) {
	h.Capabilities, _ = json.Marshal(caps)
	h.Hostname, h.SelectedAccel, h.AgentVersion = caps.Hostname, caps.SelectedAccel, caps.AgentVersion
}

// registerFailed counts, rate limits and audits an anonymous registration
// failure. It never touches the host record: whoever sent it proved nothing.
func (s *Room) registerFailed(ctx context.Context, hostID, src string, failKeys []string, code string) {
	s.authFails.fail(failKeys...)
	s.metrics.Registrations.WithLabelValues(code).Inc()
	s.audit.Record(ctx, audit.Entry{Actor: "anonymous", Action: "host.register", Target: hostID, Result: code,
		CID: httpapi.CorrelationID(ctx), Detail: "source=" + src})
}

// sourceAddr is the client's IP address (the connection's peer).
func sourceAddr(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}
