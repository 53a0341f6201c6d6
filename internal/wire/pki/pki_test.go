package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

func newTestCA(t testing.TB, cn string) *CA {
	t.Helper()
	return newTestCAAt(t, cn, time.Now())
}

// newTestCAAt is a CA created at created.
func newTestCAAt(t testing.TB, cn string, created time.Time) *CA {
	t.Helper()
	certPEM, keyPEM, err := NewCA(cn, created)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func csrFromKey(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	if tmpl == nil {
		tmpl = &x509.CertificateRequest{Subject: pkix.Name{CommonName: "drover-agent"}}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func mustParseCertPEM(t testing.TB, b []byte) *x509.Certificate {
	t.Helper()
	c, err := parseCertPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewCAAndLoad(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	certPEM, keyPEM, err := NewCA("drover test CA", now)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(keyPEM, []byte("-----BEGIN PRIVATE KEY-----")) {
		t.Fatalf("CA key not PKCS#8: %s", keyPEM)
	}
	ca, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c := ca.Certificate()
	if !c.IsCA || c.Subject.CommonName != "drover test CA" || c.PublicKeyAlgorithm != x509.ECDSA {
		t.Fatalf("unexpected CA cert: CA=%v CN=%q alg=%v", c.IsCA, c.Subject.CommonName, c.PublicKeyAlgorithm)
	}
	if !c.NotBefore.Equal(now.Add(-time.Minute)) || !c.NotAfter.Equal(now.Add(CAValidity)) {
		t.Fatalf("validity %s..%s", c.NotBefore, c.NotAfter)
	}
	if !bytes.Equal(ca.CertPEM(), certPEM) {
		t.Fatal("CertPEM differs from NewCA output")
	}
	h, err := HashPEM(certPEM)
	if err != nil || h != ca.Hash() || !strings.HasPrefix(h, "sha256:") || len(h) != len("sha256:")+64 {
		t.Fatalf("HashPEM = %q, %v; Hash = %q", h, err, ca.Hash())
	}
	if _, err := NormalizePin(strings.ToUpper(h)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := NewCA("", now); err == nil {
		t.Fatal("NewCA accepted an empty common name")
	}
}

func TestLoadCARejects(t *testing.T) {
	certPEM, keyPEM, err := NewCA("a", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := NewCA("b", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := LoadCA(certPEM, keyPEM)
	srv, err := ca.ServerCertificate([]string{"localhost"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate[0]})
	srvKey, _ := encodeKey(srv.PrivateKey.(crypto.Signer))
	tests := []struct {
		name      string
		cert, key []byte
	}{
		{"mismatched key", certPEM, otherKey},
		{"not a CA", leafPEM, srvKey},
		{"garbage cert", []byte("nope"), keyPEM},
		{"garbage key", certPEM, []byte("nope")},
		{"key swapped for cert", keyPEM, certPEM},
	}
	for _, tc := range tests {
		if _, err := LoadCA(tc.cert, tc.key); err == nil {
			t.Errorf("%s: LoadCA succeeded", tc.name)
		}
	}
}

func TestSignNodeCSR(t *testing.T) {
	ca := newTestCA(t, "ca")
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	forged := csrFromKey(t, p256, &x509.CertificateRequest{
		Subject:        pkix.Name{CommonName: "other-node", Organization: []string{"system:masters"}},
		DNSNames:       []string{"other-node", "control-plane"},
		EmailAddresses: []string{"root@example.com"},
		IPAddresses:    []net.IP{net.ParseIP("10.0.0.1")},
		URIs:           []*url.URL{NodeURI("other-node")},
	})
	// Bad self-signature: flip the last byte of the DER (inside the signature).
	blk, _ := pem.Decode(csrFromKey(t, p256, nil))
	bad := bytes.Clone(blk.Bytes)
	bad[len(bad)-1] ^= 0xff
	badSig := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: bad})

	now := time.Now().Truncate(time.Second)
	tests := []struct {
		name    string
		csr     []byte
		nodeID  string
		ttl     time.Duration
		wantErr string
	}{
		{name: "p256", csr: csrFromKey(t, p256, nil), nodeID: "node-1", ttl: 24 * time.Hour},
		{name: "p384", csr: csrFromKey(t, p384, nil), nodeID: "node-1", ttl: time.Hour},
		{name: "ed25519", csr: csrFromKey(t, edKey, nil), nodeID: "node-1", ttl: time.Hour},
		{name: "forged subject and SANs ignored", csr: forged, nodeID: "node-1", ttl: time.Hour},
		{name: "leading junk before PEM", csr: append([]byte("junk\n"), csrFromKey(t, p256, nil)...), nodeID: "n", ttl: time.Hour},
		{name: "bad signature", csr: badSig, nodeID: "node-1", ttl: time.Hour, wantErr: "bad self-signature"},
		{name: "rsa-1024", csr: csrFromKey(t, rsaKey, nil), nodeID: "node-1", ttl: time.Hour, wantErr: "unsupported public key"},
		{name: "p224", csr: csrFromKey(t, p224, nil), nodeID: "node-1", ttl: time.Hour, wantErr: "unsupported ECDSA curve"},
		{name: "not pem", csr: []byte("hello"), nodeID: "node-1", ttl: time.Hour, wantErr: "no PEM"},
		{name: "certificate not csr", csr: ca.CertPEM(), nodeID: "node-1", ttl: time.Hour, wantErr: "no PEM"},
		{name: "invalid node id", csr: csrFromKey(t, p256, nil), nodeID: "Node/1", ttl: time.Hour, wantErr: "node id"},
		{name: "empty node id", csr: csrFromKey(t, p256, nil), nodeID: "", ttl: time.Hour, wantErr: "node id"},
		{name: "zero ttl", csr: csrFromKey(t, p256, nil), nodeID: "node-1", ttl: 0, wantErr: "ttl"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			certPEM, serial, notAfter, err := ca.SignNodeCSR(tc.csr, tc.nodeID, tc.ttl, now)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := mustParseCertPEM(t, certPEM)
			checkNodeCert(t, ca, c, tc.nodeID, now, tc.ttl)
			if serial != c.SerialNumber.Text(16) || c.SerialNumber.BitLen() > 128 || c.SerialNumber.Sign() <= 0 {
				t.Fatalf("serial %q vs %s", serial, c.SerialNumber)
			}
			if !notAfter.Equal(c.NotAfter) {
				t.Fatalf("notAfter %s vs %s", notAfter, c.NotAfter)
			}
		})
	}
}

func checkNodeCert(t *testing.T, ca *CA, c *x509.Certificate, nodeID string, now time.Time, ttl time.Duration) {
	t.Helper()
	if c.Subject.CommonName != nodeID || len(c.Subject.Organization) != 0 {
		t.Fatalf("subject = %v", c.Subject)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://drover/node/"+nodeID {
		t.Fatalf("URIs = %v", c.URIs)
	}
	if len(c.DNSNames)+len(c.EmailAddresses)+len(c.IPAddresses) != 0 {
		t.Fatalf("CSR SANs leaked: %v %v %v", c.DNSNames, c.EmailAddresses, c.IPAddresses)
	}
	if len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || c.IsCA {
		t.Fatalf("usage = %v, CA=%v", c.ExtKeyUsage, c.IsCA)
	}
	if !c.NotBefore.Equal(now.Add(-time.Minute)) || !c.NotAfter.Equal(now.Add(ttl)) {
		t.Fatalf("validity %s..%s", c.NotBefore, c.NotAfter)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("node cert does not verify: %v", err)
	}
	id, err := NodeID(c)
	if err != nil || id != nodeID {
		t.Fatalf("NodeID = %q, %v", id, err)
	}
}

func TestSignNodeCSRClampsToCA(t *testing.T) {
	now := time.Now()
	ca := newTestCA(t, "ca")
	key, _ := NewNodeKey()
	csr, _ := CSRFor(key)
	_, _, notAfter, err := ca.SignNodeCSR(csr, "n1", 20*CAValidity, now)
	if err != nil {
		t.Fatal(err)
	}
	if !notAfter.Equal(ca.Certificate().NotAfter) {
		t.Fatalf("notAfter %s not clamped to CA %s", notAfter, ca.Certificate().NotAfter)
	}
	if _, _, _, err := ca.SignNodeCSR(csr, "n1", time.Hour, now.Add(11*365*24*time.Hour)); err == nil {
		t.Fatal("signed with an expired CA")
	}
}

// issueRaw signs an arbitrary template with the CA, for NodeID tests.
func issueRaw(t *testing.T, ca *CA, tmpl *x509.Certificate) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl.SerialNumber = big.NewInt(42)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNodeID(t *testing.T) {
	ca := newTestCA(t, "ca")
	u := func(s string) *url.URL {
		p, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		cn   string
		uris []*url.URL
		want string // "" → error
	}{
		{"valid", "node-1", []*url.URL{u("spiffe://drover/node/node-1")}, "node-1"},
		{"cn mismatch", "other-node", []*url.URL{u("spiffe://drover/node/node-1")}, ""},
		{"empty cn", "", []*url.URL{u("spiffe://drover/node/node-1")}, ""},
		{"no uri", "node-1", nil, ""},
		{"two uris", "node-1", []*url.URL{u("spiffe://drover/node/node-1"), u("spiffe://drover/node/node-2")}, ""},
		{"wrong scheme", "node-1", []*url.URL{u("https://drover/node/node-1")}, ""},
		{"wrong trust domain", "node-1", []*url.URL{u("spiffe://evil/node/node-1")}, ""},
		{"wrong path", "node-1", []*url.URL{u("spiffe://drover/admin/node-1")}, ""},
		{"nested path", "node-1/x", []*url.URL{u("spiffe://drover/node/node-1/x")}, ""},
		{"empty id", "", []*url.URL{u("spiffe://drover/node/")}, ""},
		{"uppercase id", "Node", []*url.URL{u("spiffe://drover/node/Node")}, ""},
		{"query", "node-1", []*url.URL{u("spiffe://drover/node/node-1?x=1")}, ""},
		{"fragment", "node-1", []*url.URL{u("spiffe://drover/node/node-1#f")}, ""},
		{"userinfo", "node-1", []*url.URL{u("spiffe://a@drover/node/node-1")}, ""},
		{"escaped slash", "node-1%2fx", []*url.URL{u("spiffe://drover/node/node-1%2fx")}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := issueRaw(t, ca, &x509.Certificate{Subject: pkix.Name{CommonName: tc.cn}, URIs: tc.uris})
			got, err := NodeID(c)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("NodeID = %q, want error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("NodeID = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := NodeID(nil); err == nil {
		t.Fatal("NodeID(nil) succeeded")
	}
}

func TestNodeKeyAndCSR(t *testing.T) {
	keyPEM, err := NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(keyPEM)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		t.Fatalf("key PEM type %v", blk)
	}
	csrPEM, err := CSRFor(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := parseCSRPEM(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	if csr.Subject.CommonName != AgentCSRCommonName {
		t.Fatalf("CSR CN %q", csr.Subject.CommonName)
	}
	ca := newTestCA(t, "ca")
	certPEM, _, _, err := ca.SignNodeCSR(csrPEM, "node-9", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("issued cert does not pair with node key: %v", err)
	}
	if _, err := CSRFor([]byte("garbage")); err == nil {
		t.Fatal("CSRFor(garbage) succeeded")
	}
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 1024)
	der, _ := x509.MarshalPKCS8PrivateKey(rsaKey)
	if _, err := CSRFor(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err == nil {
		t.Fatal("CSRFor(rsa) succeeded")
	}
}

func TestServerCertificate(t *testing.T) {
	ca := newTestCA(t, "ca")
	now := time.Now()
	cert, err := ca.ServerCertificate([]string{"drover.example", "127.0.0.1", "[::1]", "LocalHost"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.Certificate) != 2 || !bytes.Equal(cert.Certificate[1], ca.Certificate().Raw) {
		t.Fatal("server chain must be [leaf, CA]")
	}
	leaf := cert.Leaf
	for _, host := range []string{"drover.example", "127.0.0.1", "::1", "localhost"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: ca.Pool(), CurrentTime: now}); err != nil {
			t.Errorf("verify %s: %v", host, err)
		}
	}
	if leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Fatalf("usage %v", leaf.ExtKeyUsage)
	}
	for _, hosts := range [][]string{nil, {""}, {"a b"}, {"http://x"}} {
		if _, err := ca.ServerCertificate(hosts, time.Hour, now); err == nil {
			t.Errorf("ServerCertificate(%q) succeeded", hosts)
		}
	}
}
