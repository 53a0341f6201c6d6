package probe

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// Steps of an endpoint check, in order.
const (
	StepDNS  = "dns"
	StepTCP  = "tcp"
	StepTLS  = "tls"
	StepHTTP = "http"
)

// maxBody bounds how much of an answer a check keeps.
const maxBody = 64 << 10

// Endpoint is one URL to check.
type Endpoint struct {
	URL *url.URL
	// ResolveAddress, when set, is dialled instead of resolving the URL's
	// host ("10.0.0.5" keeps the URL's port, "10.0.0.5:8443" replaces it);
	// SNI and certificate verification still use the URL's host.
	ResolveAddress string
	// TLS holds the roots and the client certificate; ServerName and
	// NextProtos are set from the URL.
	TLS *tls.Config
}

// Target is the URL's host:port (443 when the URL has no port).
func (e Endpoint) Target() string {
	port := e.URL.Port()
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(e.URL.Hostname(), port)
}

// Check is what CheckEndpoint saw.
type Check struct {
	Target  string // the URL's host:port
	Address string // the address dialled
	// Durations are each step's, in milliseconds, by step.
	Durations map[string]int64
	Status    int    // the HTTP answer's status, 0 when none came
	Body      []byte // the answer's body, at most 64 KiB
	Step      string // the step that failed, "" when all passed
	Err       error
}

// Data is c as a preflight hop's data.
func (c Check) Data() map[string]any {
	d := map[string]any{"target": c.Target}
	if c.Address != "" {
		d["address"] = c.Address
	}
	for step, ms := range c.Durations {
		d[step+"_ms"] = ms
	}
	if c.Status != 0 {
		d["http_status"] = c.Status
	}
	if c.Step != "" {
		d["failed_step"] = c.Step
	}
	return d
}

// CheckEndpoint resolves e's host (or takes its resolve address), connects,
// handshakes TLS and sends GET path on that connection, each step bounded by
// ctx; progress, when set, is told each step before it runs.
func CheckEndpoint(ctx context.Context, e Endpoint, path string, progress func(step string)) Check {
	c := Check{Target: e.Target(), Durations: map[string]int64{}}
	step := func(name string, fn func() error) bool {
		if progress != nil {
			progress(name)
		}
		start := time.Now()
		err := fn()
		c.Durations[name] = time.Since(start).Milliseconds()
		if err != nil {
			c.Step, c.Err = name, err
			return false
		}
		return true
	}
	host, port, _ := net.SplitHostPort(c.Target)
	var addrs []string
	if !step(StepDNS, func() error {
		var err error
		addrs, err = resolve(ctx, host, port, e.ResolveAddress)
		return err
	}) {
		return c
	}
	var conn net.Conn
	if !step(StepTCP, func() error {
		var err error
		conn, c.Address, err = dialFirst(ctx, addrs)
		return err
	}) {
		return c
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	cfg := e.TLS.Clone()
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cfg.ServerName, cfg.NextProtos = host, []string{"http/1.1"}
	tc := tls.Client(conn, cfg)
	if !step(StepTLS, func() error { return tc.HandshakeContext(ctx) }) {
		return c
	}
	step(StepHTTP, func() error {
		u := *e.URL
		u.Path, u.RawQuery = path, ""
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "drover-agent-preflight")
		req.Close = true
		if err := req.Write(tc); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(tc), req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		c.Status = resp.StatusCode
		c.Body, err = io.ReadAll(io.LimitReader(resp.Body, maxBody))
		return err
	})
	return c
}

// resolve returns the addresses to dial: the resolve address (with the
// URL's port unless it names one), the host itself when it is an IP, or
// what DNS answers.
func resolve(ctx context.Context, host, port, override string) ([]string, error) {
	if override != "" {
		if _, _, err := net.SplitHostPort(override); err == nil {
			return []string{override}, nil
		}
		return []string{net.JoinHostPort(override, port)}, nil
	}
	if net.ParseIP(host) != nil {
		return []string{net.JoinHostPort(host, port)}, nil
	}
	ips, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, net.JoinHostPort(ip, port))
	}
	return out, nil
}

// dialFirst connects to the first address that accepts.
func dialFirst(ctx context.Context, addrs []string) (net.Conn, string, error) {
	var errs []error
	var d net.Dialer
	for _, a := range addrs {
		conn, err := d.DialContext(ctx, "tcp", a)
		if err == nil {
			return conn, a, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, "", errors.New("no address to dial")
	}
	return nil, addrs[0], errors.Join(errs...)
}

// DialContext dials addr, or the resolve address in its place when set
// (keeping addr's port unless the resolve address names one): the
// transport's TLS still verifies the URL's host.
func DialContext(d *net.Dialer, override string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if override != "" {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			as, _ := resolve(ctx, "", port, override)
			addr = as[0]
		}
		return d.DialContext(ctx, network, addr)
	}
}
