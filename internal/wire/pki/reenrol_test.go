package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"testing"
	"time"
)

// nodeIdentity is a key and the certificate ca issued for it to nodeID at
// issued, living ttl.
func nodeIdentity(t *testing.T, ca *CA, nodeID string, issued time.Time, ttl time.Duration) (keyPEM, certPEM []byte) {
	t.Helper()
	keyPEM, err := NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := CSRFor(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, _, err = ca.SignNodeCSR(csr, nodeID, ttl, issued)
	if err != nil {
		t.Fatal(err)
	}
	return keyPEM, certPEM
}

func TestReenrolSignature(t *testing.T) {
	ca := newTestCAAt(t, "ca", time.Now().Add(-72*time.Hour))
	now := time.Now()
	keyPEM, certPEM := nodeIdentity(t, ca, "node-a", now.Add(-48*time.Hour), 24*time.Hour)
	cert := mustParseCertPEM(t, certPEM)
	newKey, _ := NewNodeKey()
	csr, _ := CSRFor(newKey)
	sig, err := SignReenrol(keyPEM, "node-a", csr, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyReenrol(cert, "node-a", csr, now, sig); err != nil {
		t.Fatalf("own signature refused: %v", err)
	}
	otherKey, otherCert := nodeIdentity(t, ca, "node-a", now, time.Hour)
	otherCSR, _ := CSRFor(otherKey)
	tampered := append([]byte{}, sig...)
	tampered[len(tampered)/2] ^= 1
	for name, c := range map[string]struct {
		cert *x509.Certificate
		host string
		csr  []byte
		at   time.Time
		sig  []byte
	}{
		"another host":              {cert, "node-b", csr, now, sig},
		"another csr":               {cert, "node-a", otherCSR, now, sig},
		"another time":              {cert, "node-a", csr, now.Add(time.Second), sig},
		"another certificate's key": {mustParseCertPEM(t, otherCert), "node-a", csr, now, sig},
		"tampered signature":        {cert, "node-a", csr, now, tampered},
		"no signature":              {cert, "node-a", csr, now, nil},
	} {
		if err := VerifyReenrol(c.cert, c.host, c.csr, c.at, c.sig); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}

	// Ed25519 keys sign the message itself.
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(edKey)
	edPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	edCSR, _ := CSRFor(edPEM)
	edCertPEM, _, _, err := ca.SignNodeCSR(edCSR, "node-e", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	edSig, err := SignReenrol(edPEM, "node-e", csr, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyReenrol(mustParseCertPEM(t, edCertPEM), "node-e", csr, now, edSig); err != nil {
		t.Errorf("Ed25519: %v", err)
	}
}

func TestVerifyExpiredNode(t *testing.T) {
	ca := newTestCAAt(t, "ca", time.Now().Add(-72*time.Hour))
	now := time.Now()
	_, expired := nodeIdentity(t, ca, "node-a", now.Add(-48*time.Hour), 24*time.Hour) // expired 24h ago
	_, valid := nodeIdentity(t, ca, "node-a", now, 24*time.Hour)
	cert, id, err := ca.VerifyExpiredNode(expired, now, 7*24*time.Hour)
	if err != nil || id != "node-a" || cert == nil {
		t.Fatalf("expired within grace: %v %q", err, id)
	}
	if _, id, err := ca.VerifyExpiredNode(valid, now, 0); err != nil || id != "node-a" {
		t.Fatalf("valid certificate: %v %q", err, id)
	}
	if _, _, err := ca.VerifyExpiredNode(expired, now, 23*time.Hour); !errors.Is(err, ErrCertificateTooOld) {
		t.Errorf("expired beyond grace: %v", err)
	}
	if _, _, err := ca.VerifyExpiredNode(expired, now, 0); !errors.Is(err, ErrCertificateTooOld) {
		t.Errorf("grace 0: %v", err)
	}

	other := newTestCAAt(t, "ca", now.Add(-72*time.Hour)) // same name, other key
	_, foreign := nodeIdentity(t, other, "node-a", now.Add(-48*time.Hour), 24*time.Hour)
	for name, pemBytes := range map[string][]byte{
		"another CA's":  foreign,
		"not a PEM":     []byte("garbage"),
		"a server's":    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: serverCertDER(t, ca)}),
		"the CA itself": ca.CertPEM(),
	} {
		if _, _, err := ca.VerifyExpiredNode(pemBytes, now, 7*24*time.Hour); err == nil {
			t.Errorf("%s certificate accepted", name)
		}
	}
}

// serverCertDER is a server certificate of ca (no client authentication).
func serverCertDER(t *testing.T, ca *CA) []byte {
	t.Helper()
	c, err := ca.ServerCertificate([]string{"127.0.0.1"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return c.Certificate[0]
}
