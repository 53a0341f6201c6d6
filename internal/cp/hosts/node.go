package hosts

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// Caller is the authenticated identity of a node request.
type Caller struct {
	ID    string
	state hostState
}

// NodeAuth binds a request to its client certificate: the certificate's
// node id must equal {id}, and the host must not be revoked or superseded.
func (s *Room) NodeAuth(next func(w http.ResponseWriter, r *http.Request, c Caller) error) http.Handler {
	return httpapi.Handle(s.log, func(w http.ResponseWriter, r *http.Request) error {
		c, err := s.authenticate(r)
		if err != nil {
			return err
		}
		return next(w, r, c)
	})
}

// authenticate is NodeAuth's check. It is a function of its own, never
// inlined, so that its frame (≈ 700 bytes) is not on the stack of a handler
// that then parks: a long-poll's goroutine stack is halved by the GC only
// while its parked frames use less than a quarter of it, and every frame
// between net/http and the parked select counts (docs/performance.md,
// "Memory per idle long-poll: measured breakdown").
//
//go:noinline
func (s *Room) authenticate(r *http.Request) (Caller, error) {
	var id string // the certificate's node id, once known
	refuse := func(status int, code, format string, args ...any) error {
		s.metrics.NodeAuthFailed.WithLabelValues(code).Inc()
		he := httpapi.Errorf(status, code, format, args...)
		if status == http.StatusForbidden { // an authenticated node acting outside its identity
			s.audit.Record(r.Context(), audit.Entry{Actor: "node:" + id, Action: "node.auth",
				Target: r.PathValue("id"), Result: code, CID: httpapi.CorrelationID(r.Context()),
				Detail: r.Method + " " + r.URL.Path + ": " + he.Message})
		}
		return he
	}
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return Caller{}, refuse(http.StatusUnauthorized, "client_certificate_required",
			"this route requires a node client certificate")
	}
	cert := r.TLS.PeerCertificates[0]
	var err error
	id, err = pki.NodeID(cert)
	if err != nil {
		return Caller{}, refuse(http.StatusUnauthorized, "client_certificate_invalid", "client certificate: %v", err)
	}
	// The handshake checked the certificate's lifetime; a connection
	// outlives it (HTTP/2 keep-alive, the framed connection), so each
	// request checks it again.
	if now := s.cfg.Now(); now.After(cert.NotAfter) {
		return Caller{}, refuse(http.StatusUnauthorized, "client_certificate_expired",
			"client certificate expired at %s; the agent must renew before expiry or enrol again",
			cert.NotAfter.UTC().Format(time.RFC3339))
	}
	if want := r.PathValue("id"); want != id {
		return Caller{}, refuse(http.StatusForbidden, "node_mismatch",
			"certificate is for node %q, not %q", id, want)
	}
	hs, err := s.cache.get(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return Caller{}, refuse(http.StatusForbidden, "node_identity_revoked", "node identity revoked: host %q no longer exists", id)
	} else if err != nil {
		return Caller{}, err
	}
	if hs.revoked {
		if hs.status != api.HostAuthFailed { // revoked before revocation set the status
			s.markAuthFailed(r.Context(), id, "node_identity_revoked")
		}
		return Caller{}, refuse(http.StatusForbidden, "node_identity_revoked", "node identity revoked")
	}
	// A certificate issued before the host's latest enrolment belongs to
	// a previous (possibly cloned) identity.
	if issued := cert.NotBefore.Add(pki.Backdate); issued.Before(hs.enrolledAt.Add(-time.Second)) {
		// The CA issued this certificate to the host: authenticated
		// evidence that an older identity of it is still in use.
		if hs.status != api.HostAuthFailed {
			s.markAuthFailed(r.Context(), id, "node_identity_superseded")
		}
		return Caller{}, refuse(http.StatusForbidden, "node_identity_superseded",
			"node identity superseded by a later enrolment")
	}
	return Caller{ID: id, state: hs}, nil
}

func (s *Room) identity(nodeID string, certPEM []byte, notAfter time.Time) api.Identity {
	return api.Identity{
		NodeID: nodeID, CertificatePEM: string(certPEM), CABundlePEM: string(s.ca.CertPEM()),
		NotAfter: notAfter, JWKS: s.keys.PublicSet(),
		HeartbeatInterval: api.Duration(s.cfg.HeartbeatInterval),
	}
}

// Renew issues a fresh certificate to an authenticated, non-revoked node.
func (s *Room) Renew(w http.ResponseWriter, r *http.Request, c Caller) error {
	ctx := r.Context()
	var req api.RenewRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	now := s.cfg.Now().UTC()
	var ident api.Identity
	renewed := audit.Entry{Actor: "node:" + c.ID, Action: "host.renew", Target: c.ID, Result: "ok",
		CID: httpapi.CorrelationID(ctx)}
	_, err := s.updateHost(ctx, c.ID, func(h *store.Host) error {
		if h.Revoked {
			return httpapi.Errorf(http.StatusForbidden, "node_identity_revoked", "node identity revoked")
		}
		certPEM, serial, notAfter, err := s.ca.SignNodeCSR([]byte(req.CSRPEM), h.ID, s.cfg.CertTTL, now)
		if err != nil {
			return httpapi.Invalid([]api.FieldError{{Field: "csr_pem", Message: err.Error()}})
		}
		h.CertSerial, h.CertNotAfter = serial, notAfter
		ident = s.identity(h.ID, certPEM, notAfter)
		return nil
	}, func(_, _ store.Host) []store.AuditEvent { return []store.AuditEvent{s.audit.Event(ctx, renewed)} })
	if err != nil {
		renewed.Result = "refused"
		s.audit.Record(ctx, renewed)
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, ident)
	return nil
}

// Heartbeat records liveness; the store is written only on transitions
// (status, a new failure, capacity). A heartbeat whose body has the digest
// of the host's previous one is not decoded again (liveness.decoded), and
// a body-less one whose If-Match is the ETag of the previous one repeats
// it (412 heartbeat_state_unknown when this replica does not hold it; the
// agent then sends the body). The answer is the interval: a
// HeartbeatResponse, or with Prefer: return=minimal a 204 with
// Drover-Heartbeat-Interval; both carry the body's ETag.
func (s *Room) Heartbeat(w http.ResponseWriter, r *http.Request, c Caller) error {
	hb, tag, err := s.heartbeatOf(r, c.ID)
	if err != nil {
		return err
	}
	s.metrics.Heartbeats.Inc()
	ctx := r.Context()
	now := s.cfg.Now().UTC()
	// The capacity first: a host seen healthy (a placement right after
	// the first heartbeat) has it stored already.
	if hb.Capacity != nil {
		if c.state.capacity == nil || *c.state.capacity != *hb.Capacity { // compared by value: no encoding per beat
			b, _ := json.Marshal(hb.Capacity)
			if _, err := s.updateHost(ctx, c.ID, func(h *store.Host) error {
				h.Capacity = b
				if hb.AgentVersion != "" {
					h.AgentVersion = hb.AgentVersion
				}
				return nil
			}, nil); err != nil {
				return err
			}
		}
	}
	if err := s.live.beat(ctx, c.ID, c.state, now, observe(hb, httpapi.CorrelationID(ctx), now)); err != nil {
		return err
	}
	// The header values are shared and never modified: no allocation per beat.
	w.Header()["Etag"] = tag
	if httpapi.PrefersMinimal(r) {
		// One HEADERS frame: net/http flushes a response's headers and its
		// body separately, so a body costs a second TLS record and write.
		w.Header()[api.HeaderHeartbeatInterval] = s.intervalHeader
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	w.Header()["Content-Type"] = s.jsonContentType
	_, _ = w.Write(s.heartbeatReply)
	return nil
}

// heartbeatOf is the heartbeat request r carries for host id, decoded or
// remembered, with its ETag header value. If-Match counts only without a
// body.
func (s *Room) heartbeatOf(r *http.Request, id string) (api.Heartbeat, []string, error) {
	buf := s.bodies.Get().(*[]byte)
	defer s.putBody(buf)
	body, err := httpapi.AppendBody((*buf)[:0], r.Body)
	*buf = body
	if err != nil {
		return api.Heartbeat{}, nil, err
	}
	if match := r.Header["If-Match"]; len(body) == 0 && len(match) > 0 {
		hb, tag, ok := s.live.matched(id, match[0])
		if !ok || len(match) > 1 {
			return api.Heartbeat{}, nil, httpapi.Errorf(http.StatusPreconditionFailed, "heartbeat_state_unknown",
				"If-Match is not the ETag of this host's last heartbeat on this replica: send the whole heartbeat")
		}
		return hb, tag, nil
	}
	sum := sumOf(body)
	if hb, tag, ok := s.live.decoded(id, sum); ok {
		return hb, tag, nil
	}
	var hb api.Heartbeat
	if err := httpapi.DecodeJSONBytes(body, &hb); err != nil {
		return api.Heartbeat{}, nil, err
	}
	return hb, s.live.remember(id, sum, hb), nil
}

// maxPooledBody is the largest heartbeat body buffer kept for reuse.
const maxPooledBody = 64 << 10

func (s *Room) putBody(b *[]byte) {
	if cap(*b) <= maxPooledBody {
		s.bodies.Put(b)
	}
}

// PutCapabilities replaces the host's reported capabilities (the agent
// sends them when they change).
func (s *Room) PutCapabilities(w http.ResponseWriter, r *http.Request, c Caller) error {
	ctx := r.Context()
	var caps api.Capabilities
	if err := httpapi.DecodeJSON(r, &caps); err != nil {
		return err
	}
	if fields := caps.Validate("capabilities"); len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	b, _ := json.Marshal(caps)
	var drift string
	_, err := s.updateHost(ctx, c.ID, func(h *store.Host) error {
		if h.OSFamily != caps.OSFamily {
			return httpapi.Invalid([]api.FieldError{{Field: "capabilities.os_family",
				Message: fmt.Sprintf("os_family %q does not match the host record (%q)", caps.OSFamily, h.OSFamily)}})
		}
		h.Capabilities, h.Hostname, h.SelectedAccel, h.AgentVersion = b, caps.Hostname, caps.SelectedAccel, caps.AgentVersion
		drift = checkProfile(h, caps.ControlPlaneURL, caps.TerminalURL, httpapi.CorrelationID(ctx), s.cfg.Now().UTC())
		return nil
	}, func(_, after store.Host) []store.AuditEvent {
		return append(s.driftRecords(ctx, "node:"+c.ID, c.ID, drift, after), s.audit.Event(ctx, audit.Entry{
			Actor: "node:" + c.ID, Action: "host.capabilities", Target: c.ID, Result: "ok", CID: httpapi.CorrelationID(ctx)}))
	})
	if err != nil {
		return err
	}
	if lw, ok := s.instances.(LocalWorkloads); ok {
		lw.SyncLocalWorkloads(ctx, c.ID, caps.LocalWorkloads)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// JWKS is the task-signing public keys.
func (s *Room) JWKS(w http.ResponseWriter, _ *http.Request, _ Caller) error {
	httpapi.WriteJSON(w, http.StatusOK, s.keys.PublicSet())
	return nil
}

// NodeAuthID is NodeAuth for a handler that takes only the caller's node id
// (httpapi.NodeHandler).
//
// One frame of its own (not httpapi.Handle around a closure): long-polls
// park below it, and every frame under a parked long-poll counts against
// the size its stack can shrink to.
//
// It is the top of a parked request's chain (httpapi.Park): the error the
// request finishes with is written then, and it marks the chain returned.
func (s *Room) NodeAuthID(next httpapi.NodeHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.authenticateID(r)
		if err == nil {
			err = next(w, r, id)
		}
		if err != nil {
			s.answerError(w, r, err)
		}
	})
}

// answerError writes err, or, for a parked request, has its final error
// written when it finishes.
//
//go:noinline
func (s *Room) answerError(w http.ResponseWriter, r *http.Request, err error) {
	p, ok := httpapi.ParkOf(err)
	if !ok {
		s.writeError(w, r, err)
		return
	}
	p.Then(func(err error) error {
		if err != nil {
			s.writeError(w, r, err)
		}
		return nil
	})
	p.Returned()
}

//go:noinline
func (s *Room) writeError(w http.ResponseWriter, r *http.Request, err error) {
	httpapi.WriteError(s.log, w, r, err)
}

// authenticateID is authenticate for the node id alone.
//
//go:noinline
func (s *Room) authenticateID(r *http.Request) (string, error) {
	c, err := s.authenticate(r)
	return c.ID, err
}
