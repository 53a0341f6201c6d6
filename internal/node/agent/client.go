package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// APIError is a non-2xx answer from the control plane.
type APIError struct {
	Status     int
	Code       string
	Message    string
	Body       string
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("control plane answered %d %s: %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("control plane answered %d: %s", e.Status, e.Body)
}

// Retryable reports whether trying again later may succeed: server errors,
// rate limits and conflicts with transient state are; auth and validation
// errors are not.
func (e *APIError) Retryable() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests || e.Status == http.StatusRequestTimeout
}

// IsStatus reports whether err is an APIError with the given status.
func IsStatus(err error, status int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == status
}

// client speaks to the node-facing API. Its TLS client certificate can be
// swapped at runtime (renewal) without rebuilding the transport.
type client struct {
	base   *url.URL
	http   *http.Client
	tls    *tls.Config // the transport's; never modified after newClient
	cert   atomic.Pointer[tls.Certificate]
	nodeID atomic.Value // string
}

// newClient builds a client trusting roots (or, when roots is nil, checking
// the server's chain against a pinned CA hash via verify).
func newClient(baseURL string, roots *x509.CertPool, verify func([][]byte, [][]*x509.Certificate) error) (*client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("control plane URL: %w", err)
	}
	c := &client{base: u}
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

// do sends a JSON request and decodes a JSON answer into out (if non-nil).
// It returns the HTTP status for callers that branch on 204.
func (c *client) do(ctx context.Context, method, path, cid string, in, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, err
		}
		body = bytes.NewReader(b)
	}
	u := c.base.ResolveReference(&url.URL{Path: path})
	if i := bytes.IndexByte([]byte(path), '?'); i >= 0 {
		u = c.base.ResolveReference(&url.URL{Path: path[:i], RawQuery: path[i+1:]})
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return 0, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cid != "" {
		req.Header.Set(api.HeaderCorrelationID, cid)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode >= 300 {
		ae := &APIError{Status: resp.StatusCode, Body: string(raw)}
		var eb api.ErrorBody
		if json.Unmarshal(raw, &eb) == nil {
			ae.Code, ae.Message = eb.Error.Code, eb.Error.Message
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			ae.RetryAfter = time.Duration(s) * time.Second
		}
		return resp.StatusCode, ae
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode %s %s response: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

func (c *client) nodePath(format string, args ...any) string {
	return "/internal/v1/nodes/" + url.PathEscape(c.node()) + fmt.Sprintf(format, args...)
}
