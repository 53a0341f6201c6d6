package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/nodemux"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// simAgent is one simulated node agent: its own key, its own client
// certificate from a real enrolment, and its own connection: framed
// (nodemux), as the real agent's, or HTTP/2 (Config.HTTP2).
type simAgent struct {
	idx   int
	id    string
	local *net.TCPAddr // loopback source address, or nil
	base  string       // node URL
	tr    interface {
		http.RoundTripper
		CloseIdleConnections()
	}
	nc *nodeapi.Client // over tr, with the agent's certificate
	// http2 keeps the agent on HTTP/2 (Config.HTTP2).
	http2 bool
	// resume keeps the agent's TLS session tickets (Config.NoTLSResumption).
	resume bool
	// gate bounds the harness's concurrent client handshakes (nil: no bound).
	gate chan struct{}
}

// retryable is the bench's rule for retrying an answer: rate limits and
// server errors.
func retryable(e *nodeapi.Error) bool {
	return e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// sourceAddr spreads agents over 127.1.0.0/16 when the control plane is on
// IPv4 loopback: every agent enrols from its own address (the register
// route limits attempts per client IP) and gets its own ephemeral port range.
func sourceAddr(nodeURL string, i int) *net.TCPAddr {
	u, err := url.Parse(nodeURL)
	if err != nil {
		return nil
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || ip.To4() == nil || !ip.IsLoopback() || i >= 250*256 {
		return nil
	}
	return &net.TCPAddr{IP: net.IPv4(127, 1, byte(i/250), byte(i%250+1))}
}

func dialer(local *net.TCPAddr) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if local != nil {
		d.LocalAddr = local
	}
	return d.DialContext
}

// transport is the kind the real agent uses (internal/node/agent/client.go):
// HTTP/2 over TLS 1.3. With a gate, at most cap(gate) of the harness's
// client-side handshakes run at once (Config.ClientHandshakes).
func transport(tlsCfg *tls.Config, local *net.TCPAddr, gate chan struct{}) *http.Transport {
	tr := &http.Transport{
		DialContext:         dialer(local),
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		DisableCompression:  true, // as the real agent (agent.newClient)
		// The real agent lets one request dial while it has no connection
		// (agent.oneDial); against this HTTP/2 server the limit does the same.
		MaxConnsPerHost: 1,
		MaxIdleConns:    4,
		IdleConnTimeout: 90 * time.Second,
	}
	if gate != nil {
		tr.DialTLSContext = gatedDialTLS(tlsCfg, local, gate)
	}
	return tr
}

// gatedDialTLS dials TLS as the transport would, through gatedHandshake.
func gatedDialTLS(tlsCfg *tls.Config, local *net.TCPAddr, gate chan struct{}) func(ctx context.Context, network, addr string) (net.Conn, error) {
	handshake := gatedHandshake(tlsCfg, local, gate)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		tc, err := handshake(ctx, network, addr)
		if err != nil {
			return nil, err // not a nil *tls.Conn in a non-nil net.Conn
		}
		return tc, nil
	}
}

// gatedHandshake dials addr and completes the TLS handshake offering
// protos (none: HTTP/2 first), holding a slot of gate (nil: no bound)
// from before the TCP dial to the end of the handshake. The simulated
// agents share this machine's cores, where real agents each have their
// own: unbounded, thousands of client handshakes starve together and
// overrun their 10 s timeout, which is the harness's failure, not the
// server's. Time spent waiting for a slot still counts in every figure
// measured from before the dial (the storm's "back" times).
func gatedHandshake(tlsCfg *tls.Config, local *net.TCPAddr, gate chan struct{},
	protos ...string) func(ctx context.Context, network, addr string) (*tls.Conn, error) {
	dial := dialer(local)
	return func(ctx context.Context, network, addr string) (*tls.Conn, error) {
		if gate != nil {
			select {
			case gate <- struct{}{}:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			defer func() { <-gate }()
		}
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return nodeapi.ClientHandshake(ctx, raw, tlsCfg.Clone(), addr, 10*time.Second, protos...)
	}
}

// enrol registers the agent with its bootstrap token exactly as the real
// agent does (own P-256 key, CSR, pinned CA hash) and installs the issued
// client certificate. roots is shared by all agents once known.
func (a *simAgent) enrol(ctx context.Context, token, caHash string, roots *atomic.Pointer[x509.CertPool], retries *atomic.Int64) error {
	keyPEM, err := pki.NewNodeKey()
	if err != nil {
		return err
	}
	csrPEM, err := pki.CSRFor(keyPEM)
	if err != nil {
		return err
	}
	req := api.RegisterRequest{HostID: a.id, BootstrapToken: token, CSRPEM: string(csrPEM),
		Capabilities: api.Capabilities{Hostname: a.id, OSFamily: api.OSLinux, Arch: "amd64", CPUCores: 2,
			RAMTotalMB: 2048, AgentVersion: "bench"}}
	u, _ := url.Parse(a.base)
	bootTLS := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, // checked by the pin below
		VerifyPeerCertificate: pki.PinnedVerify(caHash, u.Hostname())}
	btr := transport(bootTLS, a.local, a.gate)
	btr.DisableKeepAlives = true
	defer btr.CloseIdleConnections()
	boot, err := nodeapi.NewClient(&http.Client{Transport: btr, Timeout: 30 * time.Second}, a.base)
	if err != nil {
		return err
	}
	var ident api.Identity
	wait := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		ident, err = boot.Register(ctx, req)
		if err == nil {
			break
		}
		var he *nodeapi.Error
		if (errors.As(err, &he) && !retryable(he)) || attempt >= 20 || ctx.Err() != nil {
			return fmt.Errorf("register %s: %w", a.id, err)
		}
		retries.Add(1)
		d := wait
		if he != nil && he.RetryAfter > d {
			d = he.RetryAfter
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		wait = min(2*wait, 5*time.Second)
	}
	if ident.NodeID != a.id {
		return fmt.Errorf("register %s: control plane assigned %q", a.id, ident.NodeID)
	}
	cert, err := tls.X509KeyPair([]byte(ident.CertificatePEM), keyPEM)
	if err != nil {
		return fmt.Errorf("register %s: key pair: %w", a.id, err)
	}
	pool := roots.Load()
	if pool == nil {
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(ident.CABundlePEM)) {
			return fmt.Errorf("register %s: no CA in the identity", a.id)
		}
		if !roots.CompareAndSwap(nil, pool) {
			pool = roots.Load()
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, Certificates: []tls.Certificate{cert}}
	if a.resume { // as the real agent: tickets of its (only) certificate
		cfg.ClientSessionCache = nodeapi.NewSessionCache(1)
	}
	h2 := transport(cfg, a.local, a.gate)
	a.tr = h2
	if !a.http2 {
		a.tr = &nodemux.Transport{Fallback: h2, Dial: muxDial(cfg, a.local, a.gate, u.Host)}
	}
	a.nc, err = nodeapi.NewClient(&http.Client{Transport: a.tr}, a.base)
	return err
}

// muxDial dials addr as the real agent's framed transport does, offering
// nodemux.Proto first (gatedHandshake).
func muxDial(tlsCfg *tls.Config, local *net.TCPAddr, gate chan struct{}, addr string) nodemux.DialFunc {
	handshake := gatedHandshake(tlsCfg, local, gate, nodemux.Proto, "h2", "http/1.1")
	return func(ctx context.Context) (net.Conn, string, error) {
		tc, err := handshake(ctx, "tcp", addr)
		if err != nil {
			return nil, "", err
		}
		return tc, tc.ConnectionState().NegotiatedProtocol, nil
	}
}

// benchHeartbeat is what the real agent sends (capacity unchanged between
// beats, so the server writes nothing after the first).
func benchHeartbeat() api.Heartbeat {
	return api.Heartbeat{AgentVersion: "bench", Capacity: &api.CapacityReport{
		Total: api.Capacity{VCPUs: 2, MemoryMiB: 2048, DiskGiB: 20},
		Free:  api.Capacity{VCPUs: 2, MemoryMiB: 2048, DiskGiB: 20}}}
}

func (a *simAgent) heartbeat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := a.nc.Heartbeat(ctx, a.id, benchHeartbeat())
	if err == nil && resp.HeartbeatInterval == 0 {
		err = errors.New("heartbeat: empty response")
	}
	return err
}

// pollLoop long-polls for up to max tasks at a time until ctx ends,
// posting a result for every delivery: one POST .../tasks/result for a
// single delivery, one POST .../tasks/results for the deliveries of one
// wait. written is called once the first wait request is on the wire.
func (a *simAgent) pollLoop(ctx context.Context, max int, tr *tracker, errs *atomic.Int64, written func()) {
	first := true
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		if first {
			first = false
			rctx = httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{
				WroteRequest: func(httptrace.WroteRequestInfo) { written() }})
		}
		ds, err := a.nc.WaitTasks(rctx, a.id, 25*time.Second, max)
		at := time.Now()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			errs.Add(1)
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		if len(ds) > 0 {
			a.complete(ctx, ds, at, tr, errs)
		}
	}
}

// complete posts a result for each of ds, received at at, posting the
// ones that failed again, up to 5 more times.
func (a *simAgent) complete(ctx context.Context, ds []api.TaskDelivery, at time.Time, tr *tracker, errs *atomic.Int64) {
	probes := make(map[string]*pending, len(ds))
	results := make([]api.TaskResultFor, 0, len(ds))
	for _, d := range ds {
		if p := tr.get(d.CorrelationID); p != nil {
			p.deliver(at)
			probes[d.TaskID] = p
		}
		results = append(results, api.TaskResultFor{TaskID: d.TaskID, Result: api.TaskResult{Status: api.ResultSucceeded,
			Output: json.RawMessage(`{"bench":true}`), CorrelationID: d.CorrelationID, FinishedAt: time.Now().UTC()}})
	}
	for attempt := 0; len(results) > 0; attempt++ {
		failed := a.post(ctx, results)
		last := ctx.Err() != nil || attempt >= 5
		now := time.Now()
		for _, r := range results {
			if err, ok := failed[r.TaskID]; !ok || last {
				if p := probes[r.TaskID]; p != nil {
					p.finish(now, err)
				}
			}
		}
		if len(failed) == 0 || last {
			return
		}
		errs.Add(int64(len(failed)))
		results = slices.DeleteFunc(results, func(r api.TaskResultFor) bool { _, ok := failed[r.TaskID]; return !ok })
		sleep(ctx, 100*time.Millisecond)
	}
}

// post sends results, one alone on the single route, and returns the error
// of each that failed.
func (a *simAgent) post(ctx context.Context, results []api.TaskResultFor) map[string]error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	failed := map[string]error{}
	if len(results) == 1 {
		if _, err := a.nc.PostResult(ctx, a.id, results[0].TaskID, "", results[0].Result); err != nil {
			failed[results[0].TaskID] = err
		}
		return failed
	}
	ack, err := a.nc.PostResults(ctx, a.id, results)
	for i, r := range results {
		switch {
		case err != nil:
			failed[r.TaskID] = err
		case i >= len(ack.Results) || ack.Results[i].TaskID != r.TaskID:
			failed[r.TaskID] = fmt.Errorf("result %d of %s: no answer", i, r.TaskID)
		case ack.Results[i].Err() != nil:
			failed[r.TaskID] = fmt.Errorf("result of %s: %w", r.TaskID, ack.Results[i].Err())
		}
	}
	return failed
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
