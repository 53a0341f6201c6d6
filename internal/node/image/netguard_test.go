package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

func TestLocalRange(t *testing.T) {
	for _, tc := range []struct{ addr, kind string }{
		{"127.0.0.1", "loopback"}, {"127.255.255.254", "loopback"}, {"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"169.254.169.254", "link-local"}, {"fe80::1", "link-local"}, {"fe80::1%eth0", "link-local"},
		{"::ffff:169.254.169.254", "link-local"},
		{"0.0.0.0", "unspecified"}, {"0.1.2.3", "unspecified"}, {"::", "unspecified"},
		{"10.0.0.1", ""}, {"172.16.0.1", ""}, {"192.168.1.1", ""}, {"8.8.8.8", ""},
		{"2001:db8::1", ""}, {"fd00::1", ""}, {"128.0.0.1", ""}, {"169.255.0.1", ""},
	} {
		kind, _, ok := localRange(netip.MustParseAddr(tc.addr))
		if kind != tc.kind || ok != (tc.kind != "") {
			t.Errorf("localRange(%s) = %q, %v; want %q", tc.addr, kind, ok, tc.kind)
		}
	}
}

// assertLocalRefused checks err is a url-stage FetchError for ErrLocalURL
// naming the source and the range.
func assertLocalRefused(t *testing.T, err error, source, rng string) {
	t.Helper()
	var fe *FetchError
	if !errors.As(err, &fe) || fe.Stage != StageURL || !errors.Is(err, ErrLocalURL) {
		t.Fatalf("Fetch() = %v, want a url-stage FetchError for ErrLocalURL", err)
	}
	if msg := err.Error(); !strings.Contains(msg, source) || !strings.Contains(msg, rng) {
		t.Errorf("error %q does not name %s and %s", msg, source, rng)
	}
}

func TestFetchRefusesLocalURLs(t *testing.T) {
	content := []byte("image behind loopback")
	ts := newTestServer(t, content)
	port := ts.Listener.Addr().(*net.TCPAddr).Port
	good := digestOf(content)
	c := newTestCache(t, Options{})
	for _, tc := range []struct{ name, url, rng string }{
		{"loopback", ts.URL + "/ok", "127.0.0.0/8"},
		{"loopback elsewhere in 127/8", fmt.Sprintf("http://127.1.2.3:%d/ok", port), "127.0.0.0/8"},
		{"cloud metadata", "http://169.254.169.254/latest/meta-data/iam/security-credentials/", "169.254.0.0/16"},
		{"cloud metadata over https", "https://169.254.169.254/computeMetadata/v1/", "169.254.0.0/16"},
		{"ipv6 loopback", fmt.Sprintf("http://[::1]:%d/ok", port), "::1/128"},
		{"ipv4-mapped loopback", fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/ok", port), "127.0.0.0/8"},
		{"ipv6 link-local", "http://[fe80::1%25lo]/img", "fe80::/10"},
		{"unspecified", fmt.Sprintf("http://0.0.0.0:%d/ok", port), "0.0.0.0/8"},
		{"name resolving to loopback", fmt.Sprintf("http://localhost:%d/ok", port), "(127.0.0.1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Fetch(t.Context(), tc.url, good)
			u, _ := url.Parse(tc.url)
			assertLocalRefused(t, err, u.Redacted(), tc.rng)
		})
	}
	if n := ts.total(); n != 0 {
		t.Errorf("the loopback server saw %d requests", n)
	}
	if _, ok := c.Lookup(good); ok {
		t.Error("a refused fetch stored the blob")
	}

	// Allowed by the option (and only then).
	allowed := newTestCache(t, Options{AllowLocalURLs: true})
	if _, err := allowed.Fetch(t.Context(), ts.URL+"/ok", good); err != nil {
		t.Fatalf("with AllowLocalURLs: %v", err)
	}
}

// The dial itself is checked (Control on the dialer), whatever the URL's
// host looked like when it was resolved first: a DNS answer that changes
// between the check and the dial (rebinding) still cannot reach the node.
func TestDialRefusesLocalAddress(t *testing.T) {
	ts := newTestServer(t, []byte("x"))
	c := newTestCache(t, Options{})
	// Bypass Fetch's pre-check: only the dialer stands in the way.
	resp, err := c.client.Get(ts.URL + "/ok")
	if err == nil {
		_ = resp.Body.Close()
		t.Fatal("the cache's client dialed 127.0.0.1")
	}
	if !errors.Is(err, ErrLocalURL) || !strings.Contains(err.Error(), "127.0.0.0/8") {
		t.Errorf("dial error %v, want ErrLocalURL naming 127.0.0.0/8", err)
	}
	if n := ts.total(); n != 0 {
		t.Errorf("the server saw %d requests", n)
	}
}

// nonLocalIP is an address of this host outside localRanges (a test server
// there is a remote one for the checks), or the test is skipped.
func nonLocalIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skipf("interface addresses: %v", err)
	}
	for _, a := range addrs {
		pfx, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		if ip := pfx.Addr(); ip.Is4() {
			if _, _, local := localRange(ip); !local {
				return ip.String()
			}
		}
	}
	t.Skip("this host has no non-loopback, non-link-local IPv4 address")
	return ""
}

func TestFetchRefusesRedirectToLocal(t *testing.T) {
	content := []byte("secret behind loopback")
	inner := newTestServer(t, content)
	ip := nonLocalIP(t)
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skipf("listen on %s: %v", ip, err)
	}
	var outerHits atomic.Int32
	outer := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		outerHits.Add(1)
		if r.URL.Path == "/ok" {
			_, _ = w.Write(content)
			return
		}
		http.Redirect(w, r, inner.URL+"/ok", http.StatusFound)
	}))
	outer.Listener = l
	outer.Start()
	defer outer.Close()

	c := newTestCache(t, Options{})
	// The outer server is remote enough: fetching from it directly works.
	if _, err := c.Fetch(t.Context(), outer.URL+"/ok", digestOf(content)); err != nil {
		t.Fatalf("fetch from %s: %v", outer.URL, err)
	}
	c = newTestCache(t, Options{})
	_, err = c.Fetch(t.Context(), outer.URL+"/to-loopback", digestOf(content))
	assertLocalRefused(t, err, outer.URL+"/to-loopback", "127.0.0.0/8")
	if !strings.Contains(err.Error(), "redirect to "+inner.URL+"/ok") {
		t.Errorf("error %q does not name the redirect target", err)
	}
	if n := inner.total(); n != 0 {
		t.Errorf("the loopback server saw %d requests", n)
	}
	if outerHits.Load() != 2 {
		t.Errorf("outer server saw %d requests, want 2", outerHits.Load())
	}
}

func TestFetchPlainHTTPNeedsDigest(t *testing.T) {
	ts := newTestServer(t, []byte("unsigned"))
	c := newTestCache(t, Options{AllowLocalURLs: true})
	_, err := c.Fetch(t.Context(), ts.URL+"/ok", "")
	var fe *FetchError
	if !errors.As(err, &fe) || fe.Stage != StageDigest || !errors.Is(err, ErrDigestRequired) ||
		!strings.Contains(err.Error(), ts.URL+"/ok") {
		t.Fatalf("Fetch(http, no digest) = %v, want a digest-stage ErrDigestRequired naming the URL", err)
	}
	if n := ts.total(); n != 0 {
		t.Errorf("server saw %d requests", n)
	}
	// https and local paths without a digest stay malformed-digest errors.
	if _, err := c.Fetch(t.Context(), "https://images.invalid/x", ""); !errors.Is(err, ErrBadDigest) || errors.Is(err, ErrDigestRequired) {
		t.Errorf("Fetch(https, no digest) = %v, want ErrBadDigest", err)
	}
}

// A proxy the operator configured may live on loopback: the dial to it is
// not refused, while the target URL still is checked.
func TestFetchThroughLocalProxy(t *testing.T) {
	content := []byte("via the proxy")
	var proxied atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		if r.URL.Host != "images.invalid" {
			http.Error(w, "unexpected target "+r.URL.String(), http.StatusBadGateway)
			return
		}
		_, _ = w.Write(content)
	}))
	defer proxy.Close()
	pu, _ := url.Parse(proxy.URL)
	c := newTestCache(t, Options{HTTPClient: &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}})
	if _, err := c.Fetch(t.Context(), "http://images.invalid/img", digestOf(content)); err != nil {
		t.Fatalf("fetch through a loopback proxy: %v", err)
	}
	_, err := c.Fetch(t.Context(), "http://127.0.0.1:9/img", digestOf([]byte("other")))
	assertLocalRefused(t, err, "http://127.0.0.1:9/img", "127.0.0.0/8")
	if proxied.Load() != 1 {
		t.Errorf("proxy saw %d requests, want 1", proxied.Load())
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestNewCacheUncheckableTransport(t *testing.T) {
	rt := roundTripperFunc(func(*http.Request) (*http.Response, error) { return nil, io.EOF })
	dialer := &http.Transport{DialContext: (&net.Dialer{}).DialContext}
	tlsDialer := &http.Transport{DialTLSContext: func(context.Context, string, string) (net.Conn, error) { return nil, io.EOF }}
	for _, tc := range []struct {
		name   string
		client *http.Client
	}{{"custom round tripper", &http.Client{Transport: rt}}, {"own dialer", &http.Client{Transport: dialer}},
		{"own TLS dialer", &http.Client{Transport: tlsDialer}}} {
		if _, err := NewCache(Options{Dir: t.TempDir(), HTTPClient: tc.client}); err == nil || !strings.Contains(err.Error(), "local addresses") {
			t.Errorf("%s: NewCache = %v, want refused", tc.name, err)
		}
		if _, err := NewCache(Options{Dir: t.TempDir(), HTTPClient: tc.client, AllowLocalURLs: true}); err != nil {
			t.Errorf("%s with AllowLocalURLs: %v", tc.name, err)
		}
	}
}
