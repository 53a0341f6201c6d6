package hosts

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// maxProofSkew bounds the difference between a previous-certificate
// proof's signing time and the control plane's clock.
const maxProofSkew = 5 * time.Minute

// errProofRefused is the one answer to a previous-certificate proof that
// does not hold: a certificate of another CA or another host, a signature
// that does not match, or no such host. Like errTokenRefused, it tells
// nothing about the host.
func errProofRefused() *httpapi.Error {
	return httpapi.Errorf(http.StatusUnauthorized, "previous_certificate_invalid",
		"previous certificate refused: not issued by this control plane to this host, or its signature does not match; "+
			"an operator issues a bootstrap token with `drover hosts rotate-token`")
}

// reenrol enrols a host again on its agent's proof that it holds the key
// of the host's last certificate, expired at most ReenrolGrace ago (ADR
// 0021): the way back for an agent whose certificate expired while it
// could not renew, and whose bootstrap token its first enrolment used up.
// The certificate must be the last one issued to the host (a renewal or
// enrolment since makes it useless), and the new one supersedes it.
func (s *Room) reenrol(ctx context.Context, w http.ResponseWriter, req api.RegisterRequest, src string,
	failKeys []string, now time.Time) error {
	p := req.PreviousCertificate
	refuse := func(he *httpapi.Error) error {
		s.registerFailed(ctx, req.HostID, src, failKeys, he.Code)
		return he
	}
	if s.cfg.ReenrolGrace <= 0 {
		return refuse(httpapi.Errorf(http.StatusUnauthorized, "previous_certificate_disabled",
			"enrolment with a previous certificate is off on this control plane (--node-cert-reenrol-grace 0); "+
				"an operator issues a bootstrap token with `drover hosts rotate-token`"))
	}
	cert, id, err := s.ca.VerifyExpiredNode([]byte(p.CertificatePEM), now, s.cfg.ReenrolGrace)
	switch {
	case errors.Is(err, pki.ErrCertificateTooOld):
		return refuse(httpapi.Errorf(http.StatusUnauthorized, "previous_certificate_too_old",
			"%v; an operator issues a bootstrap token with `drover hosts rotate-token`", err))
	case err != nil || id != req.HostID:
		return refuse(errProofRefused())
	}
	if err := pki.VerifyReenrol(cert, req.HostID, []byte(req.CSRPEM), p.SignedAt, p.Signature); err != nil {
		return refuse(errProofRefused())
	}
	if d := now.Sub(p.SignedAt); d > maxProofSkew || d < -maxProofSkew {
		return refuse(httpapi.Errorf(http.StatusUnauthorized, "previous_certificate_proof_stale",
			"proof signed at %s, more than %s from the control plane's clock (%s): check the host's clock",
			p.SignedAt.UTC().Format(time.RFC3339), maxProofSkew, now.Format(time.RFC3339)))
	}
	previous := cert.SerialNumber.Text(16)
	var (
		ident api.Identity
		drift string
	)
	h, err := s.updateHost(ctx, req.HostID, func(h *store.Host) error {
		// Only the last certificate issued to the host: one renewed or
		// enrolled again since is a copy (a backup, a clone) or a loser
		// of a lost answer, and never comes back this way.
		if h.CertSerial != previous {
			return httpapi.Errorf(http.StatusUnauthorized, "previous_certificate_superseded",
				"certificate %s is not the last one issued to host %q: it was renewed or enrolled again since; "+
					"an operator issues a bootstrap token with `drover hosts rotate-token`", previous, h.ID)
		}
		var err error
		ident, drift, err = s.enrolProven(ctx, h, req, now)
		return err
	}, func(_, after store.Host) []store.AuditEvent {
		return append([]store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: "node:" + after.ID, Action: "host.register",
			Target: after.ID, Result: "ok", CID: httpapi.CorrelationID(ctx),
			Detail: "credential=previous_certificate previous_serial=" + previous + " cert_serial=" + after.CertSerial +
				" source=" + src})},
			s.driftRecords(ctx, "node:"+after.ID, after.ID, drift, after)...)
	})
	if errors.Is(err, store.ErrNotFound) {
		return refuse(errProofRefused())
	}
	return s.registered(ctx, w, req.HostID, src, failKeys, h, ident, err)
}
