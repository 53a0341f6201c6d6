package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"
)

// AgentCSRCommonName is the subject CN of every agent CSR. The control plane
// ignores it; the issued certificate names the host record instead.
const AgentCSRCommonName = "drover-agent"

// NewNodeKey generates the agent's ECDSA P-256 key, PEM-encoded as PKCS#8
// ("PRIVATE KEY"), which tls.X509KeyPair accepts.
func NewNodeKey() (keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate node key: %w", err)
	}
	return encodeKey(key)
}

// CSRFor builds a PEM "CERTIFICATE REQUEST" (CN "drover-agent") signed by the
// private key in keyPEM (PKCS#8 or SEC 1; ECDSA P-256/P-384 or Ed25519).
func CSRFor(keyPEM []byte) (csrPEM []byte, err error) {
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: csr key: %w", err)
	}
	if err := checkSupportedPublicKey(key.Public()); err != nil {
		return nil, fmt.Errorf("pki: csr key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: AgentCSRCommonName},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("pki: create csr: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCSR, Bytes: der}), nil
}

// NormalizePin validates a CA pin ("sha256:" + 64 hex digits, any case) and
// returns it in canonical lowercase form.
func NormalizePin(pin string) (string, error) {
	p := strings.ToLower(strings.TrimSpace(pin))
	h, ok := strings.CutPrefix(p, HashPrefix)
	if !ok {
		return "", fmt.Errorf("pki: CA hash %q must start with %q", pin, HashPrefix)
	}
	if b, err := hex.DecodeString(h); err != nil || len(b) != 32 {
		return "", fmt.Errorf("pki: CA hash %q must be %s followed by 64 hex digits", pin, HashPrefix)
	}
	return p, nil
}

// PinnedVerify returns a tls.Config.VerifyPeerCertificate function for first
// contact, used with InsecureSkipVerify=true (Go then skips its own checks
// and calls this one). It parses the chain the server presented, takes as
// the only trust anchor a certificate in it whose Hash equals pin (the CA,
// which ServerCertificate always sends second), and verifies that the leaf
// chains to that anchor, is valid now, has ExtKeyUsageServerAuth and names
// serverName (a DNS name or IP literal). A malformed pin or an empty
// serverName makes every call fail.
func PinnedVerify(pin, serverName string) func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
	return pinnedVerify(pin, serverName, time.Now)
}

func pinnedVerify(pin, serverName string, now func() time.Time) func([][]byte, [][]*x509.Certificate) error {
	want, pinErr := NormalizePin(pin)
	return func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
		if pinErr != nil {
			return pinErr
		}
		if serverName == "" {
			return errors.New("pki: pinned verify: server name is required")
		}
		if len(rawCerts) == 0 {
			return errors.New("pki: pinned verify: server presented no certificate")
		}
		certs := make([]*x509.Certificate, len(rawCerts))
		for i, raw := range rawCerts {
			c, err := x509.ParseCertificate(raw)
			if err != nil {
				return fmt.Errorf("pki: pinned verify: certificate %d: %w", i, err)
			}
			certs[i] = c
		}
		roots := x509.NewCertPool()
		inter := x509.NewCertPool()
		found := false
		for _, c := range certs[1:] {
			if subtle.ConstantTimeCompare([]byte(hashCert(c)), []byte(want)) == 1 {
				roots.AddCert(c)
				found = true
				continue
			}
			inter.AddCert(c)
		}
		if !found {
			// The leaf itself is never an anchor: a pinned key must sign it.
			return fmt.Errorf("pki: pinned verify: no CA in the server's chain matches pinned hash %s", want)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{
			DNSName:       serverName,
			Roots:         roots,
			Intermediates: inter,
			CurrentTime:   now(),
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("pki: pinned verify: %w", err)
		}
		return nil
	}
}
