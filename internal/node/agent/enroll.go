package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/drover-dev/drover/internal/node/agent/statedir"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/task"
)

// ErrNotEnrolled means the agent has no usable identity and no bootstrap
// token to get one.
var ErrNotEnrolled = errors.New("not enrolled: set NODE_AGENT_BOOTSTRAP_TOKEN (from `drover hosts create` or `drover hosts rotate-token`)")

// identity returns a usable identity: the stored one if its certificate is
// still valid, otherwise a new enrolment (enrolAgain).
func (a *Agent) identity(ctx context.Context) (statedir.Identity, error) {
	id, ok, err := a.state.LoadIdentity()
	if err != nil {
		return statedir.Identity{}, fmt.Errorf("load identity: %w", err)
	}
	if ok && id.NodeID == a.nodeID && id.ControlPlaneURL == a.cfg.ControlPlaneURL {
		if a.now().Before(id.NotAfter) {
			return id, nil
		}
		a.log.Info("stored certificate expired; enrolling again", "node_id", id.NodeID, "not_after", id.NotAfter)
		return a.enrolAgain(ctx, id)
	}
	if ok {
		a.log.Info("stored identity is for another node or control plane; enrolling again", "node_id", id.NodeID,
			"control_plane_url", id.ControlPlaneURL)
	}
	return a.enroll(ctx)
}

// enrolAgain enrols an agent whose certificate prev expired: first by
// proof of prev's key (ADR 0021: its bootstrap token was used up by its
// first enrolment), then, if the control plane refuses that (expired too
// long ago, renewed elsewhere since, or turned off), with the bootstrap
// token when one is configured.
func (a *Agent) enrolAgain(ctx context.Context, prev statedir.Identity) (statedir.Identity, error) {
	id, err := a.reenrol(ctx, prev)
	if err == nil || ctx.Err() != nil {
		return id, err
	}
	if a.cfg.BootstrapToken == "" {
		return statedir.Identity{}, fmt.Errorf("%w; and no bootstrap token is set: %w", err, ErrNotEnrolled)
	}
	a.log.Warn("enrolment with the expired certificate refused; trying the bootstrap token", "err", err)
	return a.enroll(ctx)
}

// reenrol registers with prev's certificate and a signature by its key
// instead of a bootstrap token, retrying transient failures.
func (a *Agent) reenrol(ctx context.Context, prev statedir.Identity) (statedir.Identity, error) {
	return a.register(ctx, func(keyPEM, csrPEM []byte) (api.RegisterRequest, error) {
		at := a.now().UTC().Truncate(time.Second)
		sig, err := pki.SignReenrol(prev.KeyPEM, a.nodeID, csrPEM, at)
		if err != nil {
			return api.RegisterRequest{}, err
		}
		return api.RegisterRequest{HostID: a.nodeID, CSRPEM: string(csrPEM), Capabilities: a.capabilities(ctx),
			PreviousCertificate: &api.CertificateProof{CertificatePEM: string(prev.CertPEM), SignedAt: at, Signature: sig}}, nil
	})
}

// enroll registers with the bootstrap token, retrying transient failures.
func (a *Agent) enroll(ctx context.Context) (statedir.Identity, error) {
	if a.cfg.BootstrapToken == "" {
		return statedir.Identity{}, ErrNotEnrolled
	}
	if a.cfg.CAHash == "" && a.cfg.CAFile == "" {
		return statedir.Identity{}, errors.New("first contact needs NODE_AGENT_CA_HASH (printed by `drover hosts create`) or NODE_AGENT_CA_FILE")
	}
	return a.register(ctx, func(_, csrPEM []byte) (api.RegisterRequest, error) {
		return api.RegisterRequest{HostID: a.nodeID, BootstrapToken: a.cfg.BootstrapToken, CSRPEM: string(csrPEM),
			Capabilities: a.capabilities(ctx)}, nil
	})
}

// register enrols with a new key and the request build makes for its CSR
// (again for each attempt: a proof carries its time), retrying transient
// failures with jittered backoff, and stores the identity. Auth and
// validation failures are returned at once.
func (a *Agent) register(ctx context.Context, build func(keyPEM, csrPEM []byte) (api.RegisterRequest, error)) (statedir.Identity, error) {
	keyPEM, err := pki.NewNodeKey()
	if err != nil {
		return statedir.Identity{}, err
	}
	csrPEM, err := pki.CSRFor(keyPEM)
	if err != nil {
		return statedir.Identity{}, err
	}
	var ident api.Identity
	bo := newBackoff(time.Second, time.Minute)
	for {
		req, err := build(keyPEM, csrPEM)
		if err != nil {
			return statedir.Identity{}, fmt.Errorf("register host %q: %w", a.nodeID, err)
		}
		ident, err = a.bootstrap.Register(ctx, req)
		if err == nil {
			break
		}
		reason := a.noteFailure(opEnrol, err)
		var ae *APIError
		if errors.As(err, &ae) {
			// The body names the problem (field errors, expired token): log it whole.
			a.log.Error("registration refused", "status", ae.Status, "code", ae.Code, "body", ae.Body)
			if !ae.Retryable() {
				return statedir.Identity{}, fmt.Errorf("register host %q: %w", a.nodeID, err)
			}
		} else {
			a.log.Warn("registration failed; will retry", "err", err, "signal", reason)
		}
		if err := bo.wait(ctx, retryAfter(err)); err != nil {
			return statedir.Identity{}, err
		}
	}
	id := statedir.Identity{NodeID: ident.NodeID, KeyPEM: keyPEM, CertPEM: []byte(ident.CertificatePEM),
		CAPEM: []byte(ident.CABundlePEM), NotAfter: ident.NotAfter, JWKS: ident.JWKS,
		ControlPlaneURL: a.cfg.ControlPlaneURL, HeartbeatInterval: time.Duration(ident.HeartbeatInterval),
		TerminalURL: ident.TerminalURL}
	if id.NodeID != a.nodeID {
		return statedir.Identity{}, fmt.Errorf("control plane assigned node id %q, expected %q", id.NodeID, a.nodeID)
	}
	if err := a.state.SaveIdentity(id); err != nil {
		return statedir.Identity{}, fmt.Errorf("save identity: %w", err)
	}
	a.log.Info("enrolled", "node_id", id.NodeID, "cert_not_after", id.NotAfter)
	return id, nil
}

// applyIdentity installs an identity into the mTLS client and verifier.
func (a *Agent) applyIdentity(id statedir.Identity) error {
	cert, err := tls.X509KeyPair(id.CertPEM, id.KeyPEM)
	if err != nil {
		return fmt.Errorf("identity key pair: %w", err)
	}
	if a.node == nil {
		// The mTLS client trusts exactly the CA delivered at enrolment and
		// never shares connections with the certificate-less bootstrap client.
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(id.CAPEM) {
			return errors.New("identity has no CA bundle")
		}
		if a.node, err = newClient(a.cfg.ControlPlaneURL, roots, nil); err != nil {
			return err
		}
	}
	a.node.setCertificate(cert)
	a.node.setNodeID(id.NodeID)
	if a.verifier == nil {
		if a.verifier, err = task.NewVerifier(id.JWKS); err != nil {
			return fmt.Errorf("task-signing keys: %w", err)
		}
	} else if err := a.verifier.SetKeys(id.JWKS); err != nil {
		return fmt.Errorf("task-signing keys: %w", err)
	}
	a.mu.Lock()
	a.ident = id
	a.mu.Unlock()
	return nil
}

// renewLoop renews the certificate at about two thirds of its lifetime,
// with jitter, generating a new key each time.
func (a *Agent) renewLoop(ctx context.Context) error {
	bo := newBackoff(5*time.Second, 5*time.Minute)
	for {
		a.mu.Lock()
		id := a.ident
		a.mu.Unlock()
		cert, err := leafCert(id.CertPEM)
		if err != nil {
			return fmt.Errorf("parse own certificate: %w", err)
		}
		// NotBefore is backdated for clock skew, so measure the lifetime from
		// when the certificate was issued (its NotBefore plus the backdate,
		// never later than now).
		issued := cert.NotBefore.Add(pki.Backdate)
		if now := a.now(); issued.After(now) {
			issued = now
		}
		life := cert.NotAfter.Sub(issued)
		at := issued.Add(life * 2 / 3).Add(jitter(life / 10))
		if err := sleepUntil(ctx, a.now, at); err != nil {
			return nil
		}
		if !a.now().Before(cert.NotAfter) {
			// Expired before a renewal got through (the control plane was
			// out of reach): the handshake refuses this certificate now,
			// so no renewal can; enrol again instead.
			if err := a.recoverExpired(ctx, id); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				reason := a.noteFailure(opRenew, err)
				a.log.Error("enrolment after the certificate expired failed", "err", err, "signal", reason,
					"not_after", cert.NotAfter)
				if err := bo.wait(ctx, retryAfter(err)); err != nil {
					return nil
				}
			} else {
				bo.reset()
			}
			continue
		}
		if err := a.renew(ctx); err != nil {
			reason := a.noteFailure(opRenew, err)
			a.log.Error("certificate renewal failed", "err", err, "signal", reason, "not_after", cert.NotAfter)
			if err := bo.wait(ctx, retryAfter(err)); err != nil {
				return nil
			}
			continue
		}
		bo.reset()
	}
}

// recoverExpired enrols again (enrolAgain) an agent whose certificate
// prev expired while it ran, and installs the new identity.
func (a *Agent) recoverExpired(ctx context.Context, prev statedir.Identity) error {
	id, err := a.enrolAgain(ctx, prev)
	if err != nil {
		return err
	}
	if err := a.applyIdentity(id); err != nil {
		return err
	}
	a.node.closeIdle()
	a.log.Info("enrolled again after the certificate expired", "not_after", id.NotAfter)
	return nil
}

// renew asks for a new certificate over mTLS.
func (a *Agent) renew(ctx context.Context) error {
	keyPEM, err := pki.NewNodeKey()
	if err != nil {
		return err
	}
	csrPEM, err := pki.CSRFor(keyPEM)
	if err != nil {
		return err
	}
	a.jwksMu.Lock()
	gen := a.jwksGen
	a.jwksMu.Unlock()
	ident, err := a.node.Renew(ctx, a.node.node(), api.RenewRequest{CSRPEM: string(csrPEM)})
	if err != nil {
		return err
	}
	// The answer's JWKS is as old as the request: a refresh on an unknown
	// kid since then (a key rotation) has newer keys, which it must not
	// undo, also not between that refresh and its verification.
	a.jwksMu.Lock()
	defer a.jwksMu.Unlock()
	a.mu.Lock()
	id := a.ident
	a.mu.Unlock()
	id.KeyPEM, id.CertPEM, id.NotAfter = keyPEM, []byte(ident.CertificatePEM), ident.NotAfter
	if a.jwksGen == gen {
		id.JWKS = ident.JWKS
	}
	if err := a.state.SaveIdentity(id); err != nil {
		return fmt.Errorf("save renewed identity: %w", err)
	}
	if err := a.applyIdentity(id); err != nil {
		return err
	}
	a.node.closeIdle()
	a.log.Info("certificate renewed", "not_after", id.NotAfter)
	return nil
}

// caPoolFromFile reads a PEM bundle.
func caPoolFromFile(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificates", path)
	}
	return pool, nil
}

// jitter returns a uniform random duration in [-d/2, d/2).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d))) - d/2
}
