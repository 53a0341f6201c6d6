package pki

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Enrolment again with an expired certificate (ADR 0021). An agent whose
// certificate expired while the control plane was out of reach, or while
// its host was off, cannot renew over mTLS (the handshake refuses it) and
// its bootstrap token was used up by its first enrolment. It proves instead
// that it holds its last certificate's private key: it signs, with that
// key, its host id, the new CSR and the time, and sends the certificate
// and signature with the CSR. The control plane checks the certificate
// against its CA, ignoring only the expiry, and the signature against the
// certificate's key; which certificate of the host it accepts, and for how
// long after its expiry, is the control plane's rule (cp/hosts).

// reenrolContext separates these signatures from any other use of the key.
const reenrolContext = "drover re-enrol v1"

// reenrolMessage is what SignReenrol signs: the context, the host id, the
// SHA-256 of the CSR and the signing time in Unix seconds, NUL-separated.
func reenrolMessage(hostID string, csrPEM []byte, at time.Time) []byte {
	sum := sha256.Sum256(csrPEM)
	msg := []byte(reenrolContext)
	for _, part := range []string{hostID, hex.EncodeToString(sum[:]), strconv.FormatInt(at.Unix(), 10)} {
		msg = append(append(msg, 0), part...)
	}
	return msg
}

// SignReenrol signs hostID's request for a new certificate for csrPEM at
// time at with the private key in keyPEM, the key of the agent's previous
// certificate (ECDSA P-256/P-384 with SHA-256, or Ed25519).
func SignReenrol(keyPEM []byte, hostID string, csrPEM []byte, at time.Time) ([]byte, error) {
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: re-enrol key: %w", err)
	}
	msg := reenrolMessage(hostID, csrPEM, at)
	if _, ok := key.Public().(ed25519.PublicKey); ok {
		return key.Sign(rand.Reader, msg, crypto.Hash(0))
	}
	sum := sha256.Sum256(msg)
	return key.Sign(rand.Reader, sum[:], crypto.SHA256)
}

// VerifyReenrol checks that sig is cert's key's signature of hostID's
// request for csrPEM at time at (SignReenrol).
func VerifyReenrol(cert *x509.Certificate, hostID string, csrPEM []byte, at time.Time, sig []byte) error {
	var algo x509.SignatureAlgorithm
	switch cert.PublicKeyAlgorithm {
	case x509.ECDSA:
		algo = x509.ECDSAWithSHA256
	case x509.Ed25519:
		algo = x509.PureEd25519
	default:
		return fmt.Errorf("pki: re-enrol: unsupported key algorithm %s", cert.PublicKeyAlgorithm)
	}
	if err := cert.CheckSignature(algo, reenrolMessage(hostID, csrPEM, at), sig); err != nil {
		return fmt.Errorf("pki: re-enrol signature: %w", err)
	}
	return nil
}

// ErrCertificateTooOld is VerifyExpiredNode's error for a certificate that
// expired longer ago than the grace allows.
var ErrCertificateTooOld = errors.New("pki: certificate expired longer ago than the re-enrolment grace")

// VerifyExpiredNode parses a node client certificate that may have expired
// and checks it as the node listener's handshake would, except for its
// expiry: issued by this CA for client authentication, naming one node id
// (NodeID). It must not have expired more than grace before now
// (ErrCertificateTooOld). It returns the certificate and its node id.
func (ca *CA) VerifyExpiredNode(certPEM []byte, now time.Time, grace time.Duration) (*x509.Certificate, string, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, "", fmt.Errorf("pki: previous certificate: %w", err)
	}
	// Verified at a moment of its own lifetime: every check but the
	// expiry, the CA's lifetime at that moment included.
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), CurrentTime: cert.NotAfter.Add(-time.Second),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, "", fmt.Errorf("pki: previous certificate: %w", err)
	}
	if now.After(cert.NotAfter.Add(grace)) {
		return nil, "", fmt.Errorf("%w: expired at %s, grace %s", ErrCertificateTooOld,
			cert.NotAfter.UTC().Format(time.RFC3339), grace)
	}
	id, err := NodeID(cert)
	if err != nil {
		return nil, "", err
	}
	return cert, id, nil
}
