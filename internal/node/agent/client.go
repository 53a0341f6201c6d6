package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// APIError is a non-2xx answer from the control plane (its error envelope
// decoded by the node API client).
type APIError = nodeapi.Error

// IsStatus reports whether err is an APIError with the given status.
func IsStatus(err error, status int) bool { return nodeapi.IsStatus(err, status) }

// handshakeTimeout bounds a TLS handshake with the control plane.
const handshakeTimeout = 10 * time.Second

// client speaks to the node-facing API. Its TLS client certificate can be
// swapped at runtime (renewal) without rebuilding the transport.
type client struct {
	*nodeapi.Client // requests and their answers
	http            *http.Client
	tls             *tls.Config // the transport's; never modified after newClient
	cert            atomic.Pointer[tls.Certificate]
	nodeID          atomic.Value // string
	// sessions holds TLS session tickets, keyed by the client certificate
	// they were issued to (dialTLS), so that a reconnect (after a control
	// plane restart, say) resumes instead of repeating the full handshake;
	// a ticket survives transient handshake failures (nodeapi.SessionCache).
	sessions tls.ClientSessionCache
	// spare is a connection to a control plane that did not choose
	// nodemux.Proto, handed to the HTTP/2 transport's next dial (so an
	// older control plane costs no second handshake).
	spareMu sync.Mutex
	spare   *tls.Conn
	spareAt time.Time
}

// keepSpare keeps nc for the HTTP/2 transport's next dial.
func (c *client) keepSpare(nc net.Conn) {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		nc.Close()
		return
	}
	c.spareMu.Lock()
	old := c.spare
	c.spare, c.spareAt = tc, time.Now()
	c.spareMu.Unlock()
	if old != nil {
		old.Close()
	}
}

// takeSpare returns the kept connection, if it is fresh (its server may
// close an idle connection; the next request dials instead).
func (c *client) takeSpare() *tls.Conn {
	c.spareMu.Lock()
	tc, at := c.spare, c.spareAt
	c.spare = nil
	c.spareMu.Unlock()
	if tc != nil && time.Since(at) > 10*time.Second {
		tc.Close()
		return nil
	}
	return tc
}

// newClient builds a client trusting roots (or, when roots is nil, checking
// the server's chain against a pinned CA hash via verify).
func newClient(baseURL string, roots *x509.CertPool, verify func([][]byte, [][]*x509.Certificate) error) (*client, error) {
	c := &client{sessions: nodeapi.NewSessionCache(16)}
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
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:       http.ProxyFromEnvironment,
		DialContext: dialer.DialContext,
		// Direct connections: dialTLS (session resumption); through a
		// proxy: the transport's own TLS with TLSClientConfig.
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if tc := c.takeSpare(); tc != nil {
				return tc, nil
			}
			tc, err := c.dialTLS(ctx, dialer, network, addr)
			if err != nil {
				return nil, err // not a nil *tls.Conn in a non-nil net.Conn
			}
			return tc, nil
		},
		// A copy of its own: the transport's first request writes its
		// NextProtos (HTTP/2's setup), which dialTLS's clones of c.tls
		// must not race with.
		TLSClientConfig:     tlsCfg.Clone(),
		TLSHandshakeTimeout: handshakeTimeout,
		ForceAttemptHTTP2:   true,
		// The node API never compresses its answers: no Accept-Encoding
		// header on every request (and no HPACK field for the server to
		// decode).
		DisableCompression: true,
		MaxIdleConns:       4,
		IdleConnTimeout:    90 * time.Second,
	}
	c.tls = tlsCfg
	// Requests go framed over one connection (nodemux) unless the control
	// plane predates it or a proxy stands between: then HTTP/2.
	var rt http.RoundTripper = &oneDial{next: tr}
	if u, err := url.Parse(baseURL); err == nil && u.Scheme == "https" {
		if p, err := http.ProxyFromEnvironment(&http.Request{URL: u}); err == nil && p == nil {
			addr := u.Host
			if u.Port() == "" {
				addr = net.JoinHostPort(u.Hostname(), "443")
			}
			rt = &nodemux.Transport{Fallback: rt, Adopt: c.keepSpare, Dial: func(ctx context.Context) (net.Conn, string, error) {
				tc, err := c.dialTLS(ctx, dialer, "tcp", addr, nodemux.Proto, "h2", "http/1.1")
				if err != nil {
					return nil, "", err
				}
				return tc, tc.ConnectionState().NegotiatedProtocol, nil
			}}
		}
	}
	c.http = &http.Client{Transport: rt}
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

// dialTLS opens a TLS connection that presents the current client
// certificate and resumes a session issued to that same certificate when
// it has one. Binding the ticket cache to the certificate chosen here, not
// to whatever is current when the ticket arrives, matters because a
// resumed TLS 1.3 session carries the client certificate of the handshake
// that issued its ticket: a session from enrolment (no certificate) or
// from before a renewal must never stand in for the current certificate.
// Without a certificate (enrolment) nothing is cached.
func (c *client) dialTLS(ctx context.Context, d *net.Dialer, network, addr string, protos ...string) (*tls.Conn, error) {
	cfg := c.tls.Clone()
	if cert := c.cert.Load(); cert != nil && len(cert.Certificate) > 0 {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		sum := sha256.Sum256(cert.Certificate[0])
		cfg.ClientSessionCache = certSessions{cache: c.sessions, prefix: string(sum[:])}
	}
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return nodeapi.ClientHandshake(ctx, raw, cfg, addr, handshakeTimeout, protos...)
}

// certSessions is the part of a ticket cache that belongs to one client
// certificate (prefix: its SHA-256).
type certSessions struct {
	cache  tls.ClientSessionCache
	prefix string
}

func (s certSessions) Get(key string) (*tls.ClientSessionState, bool) {
	return s.cache.Get(s.prefix + key)
}

func (s certSessions) Put(key string, cs *tls.ClientSessionState) { s.cache.Put(s.prefix+key, cs) }

func (c *client) setNodeID(id string) { c.nodeID.Store(id) }

func (c *client) node() string {
	s, _ := c.nodeID.Load().(string)
	return s
}

// closeIdle drops pooled connections, so the next request handshakes with
// the current certificate.
func (c *client) closeIdle() {
	if tc := c.takeSpare(); tc != nil {
		tc.Close()
	}
	c.http.CloseIdleConnections()
}

// oneDial lets one request at a time dial while the client has no
// connection: the others wait until it has its connection and then share
// it (HTTP/2). Without it the heartbeat and the long-polls, failing
// together when the control plane restarts, each dial and handshake
// again, and the transport throws all but one connection away. Against a
// server that speaks only HTTP/1.1 the waiters dial their own connections
// once the first has one, so nothing waits behind a long-poll
// (http.Transport.MaxConnsPerHost would make them).
type oneDial struct {
	next http.RoundTripper

	mu sync.Mutex
	up bool // a request got a connection, and none failed since
	// dialing is closed when the request that is dialing has its
	// connection or has failed; nil when none is.
	dialing chan struct{}
}

func (o *oneDial) RoundTrip(req *http.Request) (*http.Response, error) {
	for {
		o.mu.Lock()
		if o.up {
			o.mu.Unlock()
			break
		}
		if o.dialing == nil {
			ch := make(chan struct{})
			o.dialing = ch
			o.mu.Unlock()
			return o.first(req, ch)
		}
		ch := o.dialing
		o.mu.Unlock()
		select {
		case <-ch:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	resp, err := o.next.RoundTrip(req)
	if err != nil {
		o.setUp(false)
	}
	return resp, err
}

// first sends req as the request that dials, releasing the others as soon
// as it has a connection.
func (o *oneDial) first(req *http.Request, ch chan struct{}) (*http.Response, error) {
	var once sync.Once
	release := func(up bool) {
		once.Do(func() {
			o.mu.Lock()
			o.up, o.dialing = up, nil
			o.mu.Unlock()
			close(ch)
		})
	}
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { release(true) }}
	resp, err := o.next.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	release(err == nil)
	if err != nil {
		o.setUp(false)
	}
	return resp, err
}

func (o *oneDial) setUp(up bool) {
	o.mu.Lock()
	o.up = up
	o.mu.Unlock()
}

// CloseIdleConnections closes the transport's idle connections (so that
// http.Client.CloseIdleConnections reaches it); the next request dials
// as the first again.
func (o *oneDial) CloseIdleConnections() {
	if ci, ok := o.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
	o.setUp(false)
}
