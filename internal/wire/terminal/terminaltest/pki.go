package terminaltest

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/pki"
)

// PKI is a fresh CA with what a gateway and a node present to each other:
// a server certificate for 127.0.0.1 and a node client certificate.
type PKI struct {
	CA     *pki.CA
	Server tls.Certificate
	Node   tls.Certificate
}

// NewPKI issues a PKI under a new CA called name, its node certificate for
// node, all valid for an hour from now.
func NewPKI(t testing.TB, name, node string) *PKI {
	t.Helper()
	now := time.Now()
	certPEM, keyPEM, err := pki.NewCA(name, now)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.ServerCertificate([]string{"127.0.0.1"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	nodeKey, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CSRFor(nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	nodePEM, _, _, err := ca.SignNodeCSR(csr, node, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	client, err := tls.X509KeyPair(nodePEM, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	return &PKI{CA: ca, Server: srv, Node: client}
}
