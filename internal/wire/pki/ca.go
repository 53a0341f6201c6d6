// Package pki owns Drover's built-in certificate authority: creating and
// loading the CA, issuing node client certificates from CSRs (identity comes
// from the caller, never from the CSR), issuing TLS server certificates,
// extracting a node id from a verified client certificate, the agent's key
// and CSR, the proof by an expired certificate's key that enrols its agent
// again (SignReenrol, VerifyReenrol, VerifyExpiredNode), and pinning the CA
// by the hash of its public key for first contact. It is pure crypto over
// PEM bytes: it must not read or write files, talk to the network or the
// store, or keep package-level mutable state, and it must stay free of cgo
// and OS-specific code (the agent imports it).
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Validity and clock-skew constants.
const (
	// CAValidity is how long a CA created by NewCA is valid.
	CAValidity = 10 * 365 * 24 * time.Hour
	// Backdate is subtracted from "now" for every NotBefore to absorb clock skew.
	Backdate = time.Minute
	// HashPrefix prefixes every CA hash ("sha256:<hex>").
	HashPrefix = "sha256:"
)

// PEM block types.
const (
	pemCertificate = "CERTIFICATE"
	pemCSR         = "CERTIFICATE REQUEST"
	pemPKCS8       = "PRIVATE KEY"
	pemSEC1        = "EC PRIVATE KEY"
)

// CA is a loaded certificate authority. It is immutable and safe for
// concurrent use.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

// NewCA creates a self-signed ECDSA P-256 CA valid for CAValidity from now
// (backdated by one minute). It returns the certificate and the PKCS#8
// private key ("PRIVATE KEY"), PEM-encoded.
func NewCA(commonName string, now time.Time) (certPEM, keyPEM []byte, err error) {
	if commonName == "" {
		return nil, nil, errors.New("pki: CA common name is required")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	spki, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: marshal CA public key: %w", err)
	}
	skid := sha256.Sum256(spki)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"drover"}},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		SubjectKeyId:          skid[:20],
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: self-sign CA: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der}), keyPEM, nil
}

// LoadCA parses a CA certificate and its private key (PKCS#8 "PRIVATE KEY"
// or SEC 1 "EC PRIVATE KEY"). The certificate must be a CA and the key must
// match it.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA certificate: %w", err)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, errors.New("pki: load CA: certificate is not a CA")
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("pki: load CA: certificate lacks the certSign key usage")
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA key: %w", err)
	}
	if err := checkSupportedPublicKey(key.Public()); err != nil {
		return nil, fmt.Errorf("pki: load CA key: %w", err)
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	pub, ok := key.Public().(equaler)
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("pki: load CA: private key does not match certificate")
	}
	return &CA{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: cert.Raw}),
	}, nil
}

// CertPEM returns the CA certificate, PEM-encoded (a fresh copy).
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// Certificate returns the parsed CA certificate. Callers must not modify it.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Pool returns a new certificate pool holding only the CA certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Hash returns the CA pin, "sha256:" + hex(sha256(SubjectPublicKeyInfo)),
// the same construction as kubeadm's discovery-token-ca-cert-hash.
func (ca *CA) Hash() string { return hashCert(ca.cert) }

// HashPEM returns the pin (see CA.Hash) of the first certificate in certPEM.
func HashPEM(certPEM []byte) (string, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return "", fmt.Errorf("pki: hash: %w", err)
	}
	return hashCert(cert), nil
}

func hashCert(c *x509.Certificate) string {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return HashPrefix + hex.EncodeToString(sum[:])
}

// parseCertPEM returns the first CERTIFICATE block of b, parsed.
func parseCertPEM(b []byte) (*x509.Certificate, error) {
	rest := b
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return nil, errors.New("no PEM CERTIFICATE block found")
		}
		if blk.Type == pemCertificate {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

// parseKeyPEM parses the first private key block in b: PKCS#8 "PRIVATE KEY"
// or SEC 1 "EC PRIVATE KEY".
func parseKeyPEM(b []byte) (crypto.Signer, error) {
	rest := b
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return nil, errors.New("no PEM private key block found")
		}
		switch blk.Type {
		case pemPKCS8:
			k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
			if err != nil {
				return nil, err
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("unsupported private key type %T", k)
			}
			return s, nil
		case pemSEC1:
			return x509.ParseECPrivateKey(blk.Bytes)
		}
	}
}

// encodeKey PEM-encodes key as PKCS#8 ("PRIVATE KEY"), the one format this
// package emits.
func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPKCS8, Bytes: der}), nil
}

// checkSupportedPublicKey accepts ECDSA P-256/P-384 and Ed25519 only.
func checkSupportedPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() || k.Curve == elliptic.P384() {
			return nil
		}
		return fmt.Errorf("unsupported ECDSA curve %s (want P-256 or P-384)", k.Curve.Params().Name)
	case ed25519.PublicKey:
		if len(k) == ed25519.PublicKeySize {
			return nil
		}
		return errors.New("malformed Ed25519 public key")
	default:
		return fmt.Errorf("unsupported public key type %T (want ECDSA P-256/P-384 or Ed25519)", pub)
	}
}

// randomSerial returns a random, positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("pki: serial: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}
