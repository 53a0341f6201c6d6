package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// localRanges are the destinations an image URL may not reach unless
// Options.AllowLocalURLs: the node itself (loopback, unspecified) and its
// link (link-local, where cloud metadata services such as 169.254.169.254
// answer with credentials).
var localRanges = []struct {
	kind   string
	prefix netip.Prefix
}{
	{"loopback", netip.MustParsePrefix("127.0.0.0/8")},
	{"loopback", netip.MustParsePrefix("::1/128")},
	{"link-local", netip.MustParsePrefix("169.254.0.0/16")},
	{"link-local", netip.MustParsePrefix("fe80::/10")},
	{"unspecified", netip.MustParsePrefix("0.0.0.0/8")},
	{"unspecified", netip.MustParsePrefix("::/128")},
}

// localRange returns the kind and range of a local address, or ok false.
// IPv4-mapped IPv6 addresses count as their IPv4 address.
func localRange(a netip.Addr) (kind string, prefix netip.Prefix, ok bool) {
	a = a.Unmap().WithZone("")
	for _, r := range localRanges {
		if r.prefix.Contains(a) {
			return r.kind, r.prefix, true
		}
	}
	return "", netip.Prefix{}, false
}

// localAddrError is ErrLocalURL with the address and range that was hit.
type localAddrError struct {
	host   string // the URL's host, or the redirect target
	addr   netip.Addr
	kind   string
	prefix netip.Prefix
}

func (e *localAddrError) Error() string {
	what := e.addr.String()
	if e.host != "" && e.host != what {
		what = e.host + " (" + what + ")"
	}
	return fmt.Sprintf("%s: %s is in the %s range %s; image URLs may not point at the node or its link unless the node allows local image URLs",
		ErrLocalURL, what, e.kind, e.prefix)
}

func (e *localAddrError) Is(target error) bool { return target == ErrLocalURL }

// checkAddr refuses a local address.
func checkAddr(host string, a netip.Addr) error {
	if kind, prefix, ok := localRange(a); ok {
		return &localAddrError{host: host, addr: a.Unmap().WithZone(""), kind: kind, prefix: prefix}
	}
	return nil
}

// checkHost refuses a URL host that is, or resolves to, a local address:
// every address the name resolves to must be remote. A name that does not
// resolve here passes (a proxy may resolve it; a direct dial would fail or
// meet the dial-time check anyway).
func checkHost(ctx context.Context, host string) error {
	if a, err := netip.ParseAddr(host); err == nil {
		return checkAddr(host, a)
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if err := checkAddr(host, a); err != nil {
			return err
		}
	}
	return nil
}

// guard keeps a Transport's dials away from local addresses: its Control
// checks the address actually dialed, after DNS, so a name that resolves
// to a remote address for the pre-check and to a local one for the dial
// (DNS rebinding) is still refused. Dials to the proxy the Transport chose
// (the operator's configuration) are not checked.
type guard struct {
	direct, checked net.Dialer
	proxies         sync.Map // proxy "host:port" → struct{}
}

func newGuard() *guard {
	g := &guard{
		direct:  net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second},
		checked: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second},
	}
	g.checked.Control = func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: dialing %q: not an IP address", ErrLocalURL, address)
		}
		return checkAddr("", ap.Addr())
	}
	return g
}

func (g *guard) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if _, ok := g.proxies.Load(addr); ok {
		return g.direct.DialContext(ctx, network, addr)
	}
	return g.checked.DialContext(ctx, network, addr)
}

// proxy wraps a Transport's Proxy function to remember the proxies it
// picks, whose dials dial then leaves alone.
func (g *guard) proxy(next func(*http.Request) (*url.URL, error)) func(*http.Request) (*url.URL, error) {
	if next == nil {
		return nil
	}
	return func(req *http.Request) (*url.URL, error) {
		u, err := next(req)
		if u != nil && err == nil {
			port := u.Port()
			if port == "" {
				port = map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[u.Scheme]
			}
			g.proxies.Store(net.JoinHostPort(u.Hostname(), port), struct{}{})
		}
		return u, err
	}
}

// httpClient returns the client Fetch uses: a copy of c (nil: a client
// with dial, TLS and response-header timeouts but no overall timeout, ctx
// bounds it) that stops after maxRedirects redirects and, unless
// allowLocal, checks every redirect target and every dialed address
// against localRanges. A transport that dials its own way cannot be
// checked: it is refused unless allowLocal.
func httpClient(c *http.Client, allowLocal bool) (*http.Client, error) {
	var cp http.Client
	if c != nil {
		cp = *c
	}
	var tr *http.Transport
	switch t := cp.Transport.(type) {
	case nil:
		tr = http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = newGuard().direct.DialContext
		tr.TLSHandshakeTimeout = 15 * time.Second
		tr.ResponseHeaderTimeout = 60 * time.Second
		tr.IdleConnTimeout = 90 * time.Second
	case *http.Transport:
		tr = t.Clone()
		// DialContext (set below) takes priority over Dial, but a TLS
		// dialer would bypass it for https.
		//lint:ignore SA1019 a deprecated DialTLS still dials https its own way
		dialTLS := tr.DialTLS != nil
		if !allowLocal && (tr.DialContext != nil || tr.DialTLSContext != nil || dialTLS) {
			return nil, errors.New("image: options: http client: a transport with its own dial function cannot be kept from local addresses (set AllowLocalURLs or leave dialing to the cache)")
		}
	default:
		if !allowLocal {
			return nil, fmt.Errorf("image: options: http client: a %T transport cannot be kept from local addresses (set AllowLocalURLs or use an *http.Transport)", t)
		}
	}
	if tr != nil {
		if !allowLocal {
			g := newGuard()
			tr.DialContext, tr.Proxy = g.dial, g.proxy(tr.Proxy)
		}
		cp.Transport = tr
	}
	next := cp.CheckRedirect
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) > maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		if !allowLocal {
			if err := checkHost(req.Context(), req.URL.Hostname()); err != nil {
				return fmt.Errorf("redirect to %s: %w", req.URL.Redacted(), err)
			}
		}
		if next != nil {
			return next(req, via)
		}
		return nil
	}
	return &cp, nil
}

// GuardedClient is the http client the cache fetches with, for other
// fetchers of the node (the OCI puller) that must keep the same rules: a
// copy of c (nil: the cache's default client) that stops after 5
// redirects and, unless allowLocal, refuses loopback, link-local and
// unspecified addresses on every redirect and every dial (ErrLocalURL).
func GuardedClient(c *http.Client, allowLocal bool) (*http.Client, error) {
	return httpClient(c, allowLocal)
}

// CheckHost refuses (ErrLocalURL) a host that is, or resolves to, a
// loopback, link-local or unspecified address: the pre-check GuardedClient's
// users make before the first request, so the error names the host.
func CheckHost(ctx context.Context, host string) error { return checkHost(ctx, host) }
