package agent

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/wire/nodeapi"
)

// APIError is a non-2xx answer from the control plane (its error envelope
// decoded by the node API client).
type APIError = nodeapi.Error

// IsStatus reports whether err is an APIError with the given status.
func IsStatus(err error, status int) bool { return nodeapi.IsStatus(err, status) }

// client speaks to the node-facing API. Its TLS client certificate can be
// swapped at runtime (renewal) without rebuilding the transport.
type client struct {
	*nodeapi.Client // requests and their answers
	http            *http.Client
	tls             *tls.Config // the transport's; never modified after newClient
	cert            atomic.Pointer[tls.Certificate]
	nodeID          atomic.Value // string
}

// newClient builds a client trusting roots (or, when roots is nil, checking
// the server's chain against a pinned CA hash via verify).
func newClient(baseURL string, roots *x509.CertPool, verify func([][]byte, [][]*x509.Certificate) error) (*client, error) {
	c := &client{}
	tlsCfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert := c.cert.Load(); cert != nil {
				return cert, nil
			}
			return &tls.Certificate{}, nil // no certificate yet: enrolment only
		},
	}
	if roots == nil {
		tlsCfg.InsecureSkipVerify = true // replaced by the pinned-CA check below
		tlsCfg.VerifyPeerCertificate = verify
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        4,
		IdleConnTimeout:     90 * time.Second,
	}
	c.http = &http.Client{Transport: tr}
	c.tls = tlsCfg
	var err error
	if c.Client, err = nodeapi.NewClient(c.http, baseURL); err != nil {
		return nil, err
	}
	return c, nil
}

// tlsConfig returns a clone of the client's TLS configuration for other
// connections to the control plane (terminal streams). Its
// GetClientCertificate reads the current certificate, so a clone made
// before a renewal presents the renewed one.
func (c *client) tlsConfig() *tls.Config { return c.tls.Clone() }

func (c *client) setCertificate(cert tls.Certificate) { c.cert.Store(&cert) }

func (c *client) setNodeID(id string) { c.nodeID.Store(id) }

func (c *client) node() string {
	s, _ := c.nodeID.Load().(string)
	return s
}

// closeIdle drops pooled connections, so the next request handshakes with
// the current certificate.
func (c *client) closeIdle() { c.http.CloseIdleConnections() }
