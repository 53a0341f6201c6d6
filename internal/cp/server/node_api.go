package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// NodeHandler serves the node-facing API. It must be served over TLS with
// s.nodeTLS so that client certificates are verified.
func (s *Server) NodeHandler() http.Handler {
	mux := http.NewServeMux()
	for pattern, h := range s.nodeRoutes() {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return httpapi.WithCorrelation(mux)
}

// nodeRoutes is the handler of every route of the node API table
// (internal/wire/nodeapi), keyed by its ServeMux pattern; TestNodeRoutes
// checks it serves the table, all of it and nothing else.
func (s *Server) nodeRoutes() map[string]http.Handler {
	return map[string]http.Handler{
		nodeapi.Register.MuxPattern():        httpapi.Handle(s.log, s.register),
		nodeapi.Renew.MuxPattern():           s.nodeAuth(s.renew),
		nodeapi.Heartbeat.MuxPattern():       s.nodeAuth(s.heartbeat),
		nodeapi.JWKS.MuxPattern():            s.nodeAuth(s.nodeJWKS),
		nodeapi.PutCapabilities.MuxPattern(): s.nodeAuth(s.putCapabilities),
		nodeapi.WaitTask.MuxPattern():        s.nodeAuth(s.limitLongPolls(s.polls.tasks, nil, nodeIDHandler(s.tasks.Wait))),
		nodeapi.PostEvent.MuxPattern():       s.nodeAuth(nodeIDHandler(s.tasks.Event)),
		nodeapi.PostResult.MuxPattern():      s.nodeAuth(nodeIDHandler(s.tasks.Result)),
		nodeapi.DesiredInstances.MuxPattern(): s.nodeAuth(
			s.limitLongPolls(s.polls.instances, instancesLongPoll, nodeIDHandler(s.inst.NodeDesired))),
		nodeapi.InstanceStatus.MuxPattern(): s.nodeAuth(nodeIDHandler(s.inst.NodeStatus)),
		nodeapi.TerminalStream.MuxPattern(): s.term.NodeMTLS(s.nodeAuth(func(w http.ResponseWriter, r *http.Request, c nodeCaller) error {
			return s.term.NodeStream(w, r, c.id)
		})),
	}
}

// nodeCaller is the authenticated identity of a node request.
type nodeCaller struct {
	id    string
	state hostState
}

// nodeAuth binds a request to its client certificate: the certificate's
// node id must equal {id}, and the host must not be revoked or superseded.
func (s *Server) nodeAuth(next func(w http.ResponseWriter, r *http.Request, c nodeCaller) error) http.Handler {
	return httpapi.Handle(s.log, func(w http.ResponseWriter, r *http.Request) error {
		var id string // the certificate's node id, once known
		refuse := func(status int, code, format string, args ...any) error {
			s.metrics.nodeAuthFailed.WithLabelValues(code).Inc()
			he := httpapi.Errorf(status, code, format, args...)
			if status == http.StatusForbidden { // an authenticated node acting outside its identity
				s.audit.Record(r.Context(), audit.Entry{Actor: "node:" + id, Action: "node.auth",
					Target: r.PathValue("id"), Result: code, CID: httpapi.CorrelationID(r.Context()),
					Detail: r.Method + " " + r.URL.Path + ": " + he.Msg})
			}
			return he
		}
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			return refuse(http.StatusUnauthorized, "client_certificate_required",
				"this route requires a node client certificate")
		}
		cert := r.TLS.PeerCertificates[0]
		var err error
		id, err = pki.NodeID(cert)
		if err != nil {
			return refuse(http.StatusUnauthorized, "client_certificate_invalid", "client certificate: %v", err)
		}
		if want := r.PathValue("id"); want != id {
			return refuse(http.StatusForbidden, "node_mismatch",
				"certificate is for node %q, not %q", id, want)
		}
		hs, err := s.hosts.get(r.Context(), id)
		if errors.Is(err, store.ErrNotFound) {
			return refuse(http.StatusForbidden, "node_identity_revoked", "node identity revoked: host %q no longer exists", id)
		} else if err != nil {
			return err
		}
		if hs.revoked {
			return refuse(http.StatusForbidden, "node_identity_revoked", "node identity revoked")
		}
		// A certificate issued before the host's latest enrolment belongs to
		// a previous (possibly cloned) identity.
		if issued := cert.NotBefore.Add(pki.Backdate); issued.Before(hs.enrolledAt.Add(-time.Second)) {
			// The CA issued this certificate to the host: authenticated
			// evidence that an older identity of it is still in use.
			if hs.status != api.HostAuthFailed {
				s.markAuthFailed(r.Context(), id, "node_identity_superseded")
			}
			return refuse(http.StatusForbidden, "node_identity_superseded",
				"node identity superseded by a later enrolment")
		}
		return next(w, r, nodeCaller{id: id, state: hs})
	})
}

// markAuthFailed records authenticated evidence that something else holds
// an identity of the host: a certificate the CA issued to it, refused
// because a later enrolment superseded it. Anonymous failures (a wrong
// bootstrap token) never change a host's status.
func (s *Server) markAuthFailed(ctx context.Context, id, reason string) {
	var prev api.HostStatus
	_, err := s.store.UpdateHost(ctx, id, func(h *store.Host) error {
		prev = h.Status
		h.Status, h.StatusReason = api.HostAuthFailed, reason
		return nil
	})
	if err == nil && prev != api.HostAuthFailed {
		s.statusChanged(ctx, id, prev, api.HostAuthFailed, reason)
	}
}

func (s *Server) identity(nodeID string, certPEM []byte, notAfter time.Time) api.Identity {
	return api.Identity{
		NodeID: nodeID, CertificatePEM: string(certPEM), CABundlePEM: string(s.ca.CertPEM()),
		NotAfter: notAfter, JWKS: s.keys.PublicSet(),
		HeartbeatInterval: api.Duration(s.cfg.HeartbeatInterval),
	}
}

// renew issues a fresh certificate to an authenticated, non-revoked node.
func (s *Server) renew(w http.ResponseWriter, r *http.Request, c nodeCaller) error {
	ctx := r.Context()
	var req api.RenewRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	now := s.cfg.Now().UTC()
	var ident api.Identity
	h, err := s.store.UpdateHost(ctx, c.id, func(h *store.Host) error {
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
	})
	result := "ok"
	if err != nil {
		result = "refused"
	}
	s.audit.Record(ctx, audit.Entry{Actor: "node:" + c.id, Action: "host.renew", Target: c.id, Result: result,
		CID: httpapi.CorrelationID(ctx)})
	if err != nil {
		return err
	}
	s.hosts.put(h)
	httpapi.WriteJSON(w, http.StatusOK, ident)
	return nil
}

// heartbeat records liveness; the store is written only on transitions.
func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request, c nodeCaller) error {
	var hb api.Heartbeat
	if err := httpapi.DecodeJSON(r, &hb); err != nil {
		return err
	}
	s.metrics.heartbeats.Inc()
	ctx := r.Context()
	status, reason := api.HostHealthy, ""
	if hb.Diagnostic == "task_result_post_failed" {
		// The agent reaches us for heartbeats but its results do not arrive.
		status, reason = api.HostTaskResultFailed, hb.Diagnostic
	}
	if err := s.live.beat(ctx, c.id, c.state, s.cfg.Now().UTC(), status, reason); err != nil {
		return err
	}
	if hb.Capacity != nil {
		if c.state.capacity == nil || *c.state.capacity != *hb.Capacity { // compared by value: no encoding per beat
			b, _ := json.Marshal(hb.Capacity)
			h, err := s.store.UpdateHost(ctx, c.id, func(h *store.Host) error {
				h.Capacity = b
				if hb.AgentVersion != "" {
					h.AgentVersion = hb.AgentVersion
				}
				return nil
			})
			if err != nil {
				return err
			}
			s.hosts.put(h)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(s.heartbeatReply)
	return nil
}

// putCapabilities replaces the host's reported capabilities (the agent
// sends them when they change).
func (s *Server) putCapabilities(w http.ResponseWriter, r *http.Request, c nodeCaller) error {
	ctx := r.Context()
	var caps api.Capabilities
	if err := httpapi.DecodeJSON(r, &caps); err != nil {
		return err
	}
	if fields := caps.Validate("capabilities"); len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	b, _ := json.Marshal(caps)
	h, err := s.store.UpdateHost(ctx, c.id, func(h *store.Host) error {
		if h.OSFamily != caps.OSFamily {
			return httpapi.Invalid([]api.FieldError{{Field: "capabilities.os_family",
				Message: fmt.Sprintf("os_family %q does not match the host record (%q)", caps.OSFamily, h.OSFamily)}})
		}
		h.Capabilities, h.Hostname, h.SelectedAccel, h.AgentVersion = b, caps.Hostname, caps.SelectedAccel, caps.AgentVersion
		return nil
	})
	if err != nil {
		return err
	}
	s.hosts.put(h)
	s.audit.Record(ctx, audit.Entry{Actor: "node:" + c.id, Action: "host.capabilities", Target: c.id, Result: "ok",
		CID: httpapi.CorrelationID(ctx)})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) nodeJWKS(w http.ResponseWriter, _ *http.Request, _ nodeCaller) error {
	httpapi.WriteJSON(w, http.StatusOK, s.keys.PublicSet())
	return nil
}
