package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
)

// forgedChain returns [leaf, fakeCA]: fakeCA carries the real CA's public key
// (so its hash matches the pin) but was signed by an attacker, who also signed
// the leaf with their own key.
func forgedChain(t *testing.T, real *CA) [][]byte {
	t.Helper()
	atkKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	fake := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: real.cert.Subject.CommonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	// x509.CreateCertificate refuses a parent whose key is not the signer's,
	// so the "parent" is a stand-in with the fake CA's name and the attacker's key.
	atkParent := &x509.Certificate{Subject: fake.Subject, PublicKey: &atkKey.PublicKey}
	fakeDER, err := x509.CreateCertificate(rand.Reader, fake, atkParent, real.cert.PublicKey, atkKey)
	if err != nil {
		t.Fatal(err)
	}
	fakeCert, _ := x509.ParseCertificate(fakeDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(8), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, atkParent, &leafKey.PublicKey, atkKey)
	if err != nil {
		t.Fatal(err)
	}
	if hashCert(fakeCert) != real.Hash() {
		t.Fatal("forged CA should share the real CA's hash")
	}
	return [][]byte{leafDER, fakeDER}
}

func TestPinnedVerify(t *testing.T) {
	ca := newTestCA(t, "ca")
	other := newTestCA(t, "other")
	now := time.Now()
	good, err := ca.ServerCertificate([]string{"localhost", "127.0.0.1"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.ServerCertificate([]string{"localhost"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	clientCert := func() []byte {
		key, _ := NewNodeKey()
		csr, _ := CSRFor(key)
		p, _, _, err := ca.SignNodeCSR(csr, "node-1", time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		return mustParseCertPEM(t, p).Raw
	}()
	tests := []struct {
		name       string
		pin        string
		serverName string
		chain      [][]byte
		at         time.Time
		ok         bool
	}{
		{"right pin", ca.Hash(), "localhost", good.Certificate, now, true},
		{"right pin, IP server name", ca.Hash(), "127.0.0.1", good.Certificate, now, true},
		{"uppercase pin", "SHA256:" + strings.ToUpper(strings.TrimPrefix(ca.Hash(), "sha256:")), "localhost", good.Certificate, now, true},
		{"wrong pin", other.Hash(), "localhost", good.Certificate, now, false},
		{"chain from another CA", ca.Hash(), "localhost", foreign.Certificate, now, false},
		{"other CA's leaf with our CA appended", ca.Hash(), "localhost", [][]byte{foreign.Certificate[0], ca.cert.Raw}, now, false},
		{"leaf only, CA not sent", ca.Hash(), "localhost", good.Certificate[:1], now, false},
		{"leaf pinned as its own anchor", hashCert(good.Leaf), "localhost", good.Certificate, now, false},
		{"forged CA with real public key", ca.Hash(), "localhost", forgedChain(t, ca), now, false},
		{"wrong server name", ca.Hash(), "evil.example", good.Certificate, now, false},
		{"empty server name", ca.Hash(), "", good.Certificate, now, false},
		{"client cert presented as server cert", ca.Hash(), "node-1", [][]byte{clientCert, ca.cert.Raw}, now, false},
		{"expired leaf", ca.Hash(), "localhost", good.Certificate, now.Add(2 * time.Hour), false},
		{"malformed pin", "sha256:abc", "localhost", good.Certificate, now, false},
		{"pin without prefix", strings.TrimPrefix(ca.Hash(), "sha256:"), "localhost", good.Certificate, now, false},
		{"empty chain", ca.Hash(), "localhost", nil, now, false},
		{"garbage chain", ca.Hash(), "localhost", [][]byte{[]byte("x"), ca.cert.Raw}, now, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			at := tc.at
			err := pinnedVerify(tc.pin, tc.serverName, func() time.Time { return at })(tc.chain, nil)
			t.Logf("err: %v", err)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

type hsResult struct {
	state tls.ConnectionState
	err   error
}

// handshake runs a TLS handshake over loopback TCP; the server writes one
// byte after its handshake so that the client also observes late failures
// (TLS 1.3 client-certificate rejection).
func handshake(t *testing.T, serverCfg, clientCfg *tls.Config) (server, client hsResult) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan hsResult, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- hsResult{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, serverCfg)
		if err := tc.Handshake(); err != nil {
			done <- hsResult{err: err}
			return
		}
		_, err = tc.Write([]byte{1})
		done <- hsResult{state: tc.ConnectionState(), err: err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, clientCfg)
	err = tc.Handshake()
	if err == nil {
		var b [1]byte
		_, err = io.ReadFull(tc, b[:])
	}
	client = hsResult{state: tc.ConnectionState(), err: err}
	_ = tc.Close()
	return <-done, client
}

func TestTLSHandshakePinned(t *testing.T) {
	ca := newTestCA(t, "ca")
	other := newTestCA(t, "other")
	srv, err := ca.ServerCertificate([]string{"localhost"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		pin  string
		ok   bool
	}{
		{"right pin", ca.Hash(), true},
		{"wrong pin", other.Hash(), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, client := handshake(t,
				&tls.Config{Certificates: []tls.Certificate{srv}, MinVersion: tls.VersionTLS12},
				&tls.Config{
					InsecureSkipVerify:    true, //nolint:gosec // PinnedVerify does the verification.
					VerifyPeerCertificate: PinnedVerify(tc.pin, "localhost"),
					ServerName:            "localhost",
					MinVersion:            tls.VersionTLS12,
				})
			if (client.err == nil) != tc.ok {
				t.Fatalf("client err = %v, want ok=%v", client.err, tc.ok)
			}
		})
	}
}

func TestMTLSHandshakeNodeID(t *testing.T) {
	ca := newTestCA(t, "ca")
	other := newTestCA(t, "other")
	now := time.Now()
	srv, err := ca.ServerCertificate([]string{"localhost"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert := func(signer *CA, id string) tls.Certificate {
		key, err := NewNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		csr, err := CSRFor(key)
		if err != nil {
			t.Fatal(err)
		}
		certPEM, _, _, err := signer.SignNodeCSR(csr, id, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := tls.X509KeyPair(certPEM, key)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	tests := []struct {
		name   string
		client []tls.Certificate
		wantID string // "" → handshake must fail
	}{
		{"node cert from our CA", []tls.Certificate{nodeCert(ca, "node-7")}, "node-7"},
		{"node cert from another CA", []tls.Certificate{nodeCert(other, "node-7")}, ""},
		{"no client cert", nil, ""},
		{"server cert used as client cert", []tls.Certificate{srv}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			server, client := handshake(t,
				&tls.Config{
					Certificates: []tls.Certificate{srv},
					ClientAuth:   tls.RequireAndVerifyClientCert,
					ClientCAs:    ca.Pool(),
					MinVersion:   tls.VersionTLS12,
				},
				&tls.Config{
					Certificates: tc.client,
					RootCAs:      ca.Pool(),
					ServerName:   "localhost",
					MinVersion:   tls.VersionTLS12,
				})
			if tc.wantID == "" {
				if server.err == nil || client.err == nil {
					t.Fatalf("handshake succeeded: server=%v client=%v", server.err, client.err)
				}
				return
			}
			if server.err != nil || client.err != nil {
				t.Fatalf("server=%v client=%v", server.err, client.err)
			}
			peers := server.state.PeerCertificates
			if len(peers) == 0 || len(server.state.VerifiedChains) == 0 {
				t.Fatal("no verified client certificate")
			}
			id, err := NodeID(peers[0])
			if err != nil || id != tc.wantID {
				t.Fatalf("NodeID = %q, %v", id, err)
			}
		})
	}
}

// FuzzSignNodeCSR: arbitrary CSR bytes never panic, and whatever is signed
// carries exactly the caller's identity.
func FuzzSignNodeCSR(f *testing.F) {
	ca := newTestCA(f, "ca")
	key, _ := NewNodeKey()
	csr, _ := CSRFor(key)
	f.Add(csr)
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add(ca.CertPEM())
	now := time.Now().Truncate(time.Second)
	f.Fuzz(func(t *testing.T, in []byte) {
		certPEM, _, _, err := ca.SignNodeCSR(in, "node-f", time.Hour, now)
		if err != nil {
			return
		}
		checkNodeCert(t, ca, mustParseCertPEM(t, certPEM), "node-f", now, time.Hour)
	})
}

// FuzzPinnedVerify: arbitrary chains never panic, and an accepted chain always
// has a leaf that verifies against the pinned CA for the server name.
func FuzzPinnedVerify(f *testing.F) {
	ca := newTestCA(f, "ca")
	srv, err := ca.ServerCertificate([]string{"localhost"}, time.Hour, time.Now())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(srv.Certificate[0], srv.Certificate[1])
	f.Add(srv.Certificate[0], []byte{})
	f.Add([]byte{0x30, 0x00}, srv.Certificate[1])
	verify := PinnedVerify(ca.Hash(), "localhost")
	f.Fuzz(func(t *testing.T, leaf, second []byte) {
		err := verify([][]byte{leaf, second}, nil)
		if err != nil {
			return
		}
		c, perr := x509.ParseCertificate(leaf)
		if perr != nil {
			t.Fatalf("accepted unparsable leaf: %v", perr)
		}
		if _, verr := c.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: ca.Pool()}); verr != nil {
			t.Fatalf("accepted leaf that does not chain to the CA: %v", errors.Join(verr))
		}
	})
}
