package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Node identity in certificates: CN=<id> and URI SAN spiffe://drover/node/<id>.
const (
	SPIFFEScheme  = "spiffe"
	SPIFFEDomain  = "drover"
	SPIFFENodeDir = "/node/"
)

// NodeURI returns the URI SAN that names nodeID: spiffe://drover/node/<id>.
func NodeURI(nodeID string) *url.URL {
	return &url.URL{Scheme: SPIFFEScheme, Host: SPIFFEDomain, Path: SPIFFENodeDir + nodeID}
}

// SignNodeCSR verifies the CSR's self-signature and key type (ECDSA
// P-256/P-384 or Ed25519 only) and issues a client certificate for nodeID.
// The CSR's subject, SANs and extensions are ignored entirely: the identity
// is CN=nodeID plus URI SAN spiffe://drover/node/<nodeID>, with
// ExtKeyUsageClientAuth, NotBefore now-1m, NotAfter now+ttl (clamped to the
// CA's NotAfter) and a random 128-bit serial, returned as lowercase hex.
func (ca *CA) SignNodeCSR(csrPEM []byte, nodeID string, ttl time.Duration, now time.Time) (certPEM []byte, serial string, notAfter time.Time, err error) {
	if err := api.ValidHostID(nodeID); err != nil {
		return nil, "", time.Time{}, fmt.Errorf("pki: node id: %w", err)
	}
	if ttl <= 0 {
		return nil, "", time.Time{}, fmt.Errorf("pki: certificate ttl must be positive, got %s", ttl)
	}
	csr, err := parseCSRPEM(csrPEM)
	if err != nil {
		return nil, "", time.Time{}, err
	}
	sn, err := randomSerial()
	if err != nil {
		return nil, "", time.Time{}, err
	}
	notAfter = ca.clampNotAfter(now.Add(ttl))
	if !notAfter.After(now) {
		return nil, "", time.Time{}, errors.New("pki: CA certificate has expired")
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: nodeID},
		URIs:                  []*url.URL{NodeURI(nodeID)},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, "", time.Time{}, fmt.Errorf("pki: sign node certificate: %w", err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})
	return certPEM, sn.Text(16), notAfter, nil
}

// parseCSRPEM decodes the first CERTIFICATE REQUEST block, checks its
// self-signature and its key type.
func parseCSRPEM(csrPEM []byte) (*x509.CertificateRequest, error) {
	rest := csrPEM
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return nil, errors.New("pki: csr: no PEM CERTIFICATE REQUEST block found")
		}
		if blk.Type != pemCSR {
			continue
		}
		csr, err := x509.ParseCertificateRequest(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("pki: csr: %w", err)
		}
		if err := checkSupportedPublicKey(csr.PublicKey); err != nil {
			return nil, fmt.Errorf("pki: csr: %w", err)
		}
		if err := csr.CheckSignature(); err != nil {
			return nil, fmt.Errorf("pki: csr: bad self-signature: %w", err)
		}
		return csr, nil
	}
}

// ServerCertificate issues a TLS server certificate (ExtKeyUsageServerAuth)
// for hosts, each a DNS name or an IP literal (IPv6 may be bracketed), with a
// fresh ECDSA P-256 key. The returned chain is [leaf, CA] so that clients
// pinning the CA hash (PinnedVerify) find the CA in what the server sends.
func (ca *CA) ServerCertificate(hosts []string, ttl time.Duration, now time.Time) (tls.Certificate, error) {
	if len(hosts) == 0 {
		return tls.Certificate{}, errors.New("pki: server certificate needs at least one host")
	}
	if ttl <= 0 {
		return tls.Certificate{}, fmt.Errorf("pki: certificate ttl must be positive, got %s", ttl)
	}
	var (
		dns []string
		ips []net.IP
	)
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if h == "" || strings.ContainsAny(h, " /:@[]\\") {
			return tls.Certificate{}, fmt.Errorf("pki: invalid server host %q", h)
		}
		dns = append(dns, strings.ToLower(h))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: generate server key: %w", err)
	}
	sn, err := randomSerial()
	if err != nil {
		return tls.Certificate{}, err
	}
	notAfter := ca.clampNotAfter(now.Add(ttl))
	if !notAfter.After(now) {
		return tls.Certificate{}, errors.New("pki: CA certificate has expired")
	}
	cn := hosts[0]
	if len(dns) > 0 {
		cn = dns[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: cn},
		DNSNames:              dns,
		IPAddresses:           ips,
		NotBefore:             now.Add(-Backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: sign server certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: parse server certificate: %w", err)
	}
	return tls.Certificate{
		Certificate: [][]byte{der, ca.cert.Raw},
		PrivateKey:  key,
		Leaf:        leaf,
	}, nil
}

func (ca *CA) clampNotAfter(t time.Time) time.Time {
	if t.After(ca.cert.NotAfter) {
		return ca.cert.NotAfter
	}
	return t
}

// NodeID extracts the node id from a client certificate that the caller has
// already verified against the CA. The certificate must carry exactly one URI
// SAN, spiffe://drover/node/<id>, with a valid host id that equals the
// subject CN; anything else is an error.
func NodeID(cert *x509.Certificate) (string, error) {
	if cert == nil {
		return "", errors.New("pki: node id: no certificate")
	}
	if len(cert.URIs) != 1 {
		return "", fmt.Errorf("pki: node id: want exactly one URI SAN, got %d", len(cert.URIs))
	}
	u := cert.URIs[0]
	if u.Scheme != SPIFFEScheme || u.Host != SPIFFEDomain || u.User != nil || u.Opaque != "" ||
		u.RawQuery != "" || u.Fragment != "" || u.ForceQuery || u.RawPath != "" ||
		!strings.HasPrefix(u.Path, SPIFFENodeDir) {
		return "", fmt.Errorf("pki: node id: URI SAN %q is not spiffe://%s%s<id>", u.String(), SPIFFEDomain, SPIFFENodeDir)
	}
	id := strings.TrimPrefix(u.Path, SPIFFENodeDir)
	if err := api.ValidHostID(id); err != nil {
		return "", fmt.Errorf("pki: node id in URI SAN: %w", err)
	}
	if cert.Subject.CommonName != id {
		return "", fmt.Errorf("pki: node id: CN %q does not match URI SAN id %q", cert.Subject.CommonName, id)
	}
	return id, nil
}
