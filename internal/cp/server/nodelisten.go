package server

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// handshakeListener is a TLS listener that completes each connection's
// handshake on a goroutine of its own before Accept returns it. net/http
// would otherwise run the handshake on the connection's serving goroutine,
// whose stack the handshake (client-certificate verification) grows to
// 16 KiB; that goroutine then lives as long as the connection, and its
// parked HTTP/2 frames are too deep for the GC to halve it back. With the
// handshake elsewhere it stays at 8 KiB: 8 KiB less per connected agent,
// whose connection lives as long as the agent runs (docs/performance.md,
// "Memory per idle long-poll: measured breakdown"). http.Server.Serve finds
// a *tls.Conn whose handshake is done and goes straight to HTTP/2 (or
// HTTP/1.1, by ALPN).
type handshakeListener struct {
	net.Listener
	cfg     *tls.Config
	timeout time.Duration // bounds each handshake (ReadHeaderTimeout)
	log     *slog.Logger
	// handshakes counts handshakes by result: full, resumed (a session
	// ticket accepted) or failed; nil counts nothing.
	handshakes *prometheus.CounterVec
	// cpu bounds how many handshakes compute at once (gatedConn).
	cpu chan struct{}
	// mux, when set, serves the connections whose agent chose
	// nodemux.Proto (on a goroutine of their own); Accept never returns
	// them.
	mux func(*tls.Conn, *gatedConn)

	start  sync.Once
	conns  chan net.Conn
	errs   chan error
	closed chan struct{}
	close  sync.Once
}

// newHandshakeListener wraps raw; cfg must list the ALPN protocols
// (nodeListenerTLS).
func newHandshakeListener(raw net.Listener, cfg *tls.Config, timeout time.Duration, log *slog.Logger,
	handshakes *prometheus.CounterVec) *handshakeListener {
	return &handshakeListener{Listener: raw, cfg: cfg, timeout: timeout, log: log, handshakes: handshakes,
		cpu:   make(chan struct{}, max(4, 2*runtime.GOMAXPROCS(0))),
		conns: make(chan net.Conn), errs: make(chan error), closed: make(chan struct{})}
}

// nodeListenerTLS is cfg with the ALPN protocols that http.Server.ServeTLS
// would add (h2 first), so that Serve on a handshakeListener speaks HTTP/2,
// after nodemux.Proto, which an agent that offers it gets (the server's
// order decides).
func nodeListenerTLS(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	for _, p := range []string{nodemux.Proto, "h2", "http/1.1"} {
		if !slices.Contains(c.NextProtos, p) {
			c.NextProtos = append(c.NextProtos, p)
		}
	}
	return c
}

// Accept returns the next connection whose handshake succeeded.
func (l *handshakeListener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.acceptLoop() })
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; handshakes in flight are abandoned.
func (l *handshakeListener) Close() error {
	err := net.ErrClosed
	l.close.Do(func() { close(l.closed); err = l.Listener.Close() })
	return err
}

func (l *handshakeListener) acceptLoop() {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			select {
			case l.errs <- err: // http.Server retries temporary errors itself
			case <-l.closed:
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				continue
			}
			return
		}
		go l.handshake(raw)
	}
}

func (l *handshakeListener) handshake(raw net.Conn) {
	gc := &gatedConn{Conn: raw, cpu: l.cpu}
	c := tls.Server(gc, l.cfg)
	if l.timeout > 0 { // as net/http bounds its own handshakes: deadlines, no context goroutine
		_ = raw.SetDeadline(time.Now().Add(l.timeout))
	}
	err := c.HandshakeContext(context.Background())
	gc.handshakeDone() // before anything else reads from it
	if err != nil {
		l.log.Debug("node listener: TLS handshake failed", "remote", raw.RemoteAddr().String(), "err", err)
		l.count("failed")
		_ = c.Close()
		return
	}
	if c.ConnectionState().DidResume {
		l.count("resumed")
	} else {
		l.count("full")
	}
	_ = raw.SetDeadline(time.Time{})
	if l.mux != nil && c.ConnectionState().NegotiatedProtocol == nodemux.Proto {
		go l.mux(c, gc) // a fresh goroutine: this one's stack grew in the handshake
		return
	}
	select {
	case l.conns <- c:
	case <-l.closed:
		_ = c.Close()
	}
}

func (l *handshakeListener) count(result string) {
	if l.handshakes != nil {
		l.handshakes.WithLabelValues(result).Inc()
	}
}

// newHandshakeCounter is drover_node_tls_handshakes_total, registered on
// reg.
func newHandshakeCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_node_tls_handshakes_total",
		Help: "TLS handshakes on the node listener, by result: full, resumed (session ticket accepted), failed."},
		[]string{"result"})
	reg.MustRegister(c)
	return c
}

// gatedConn is a connection in its handshake that computes only while it
// holds a slot of cpu: it takes one when a read returns (what follows is
// the handshake's work on what it read: key exchange, signatures,
// certificate checks) and gives it back before the next read blocks, so
// a client that stalls holds no slot. When every agent reconnects at once
// (a control-plane restart), thousands of handshakes would otherwise share
// the CPU, all finish late and overrun their clients' timeouts together, and
// the retries repeat it: with the bound they complete one after another,
// at the same total cost, and the other goroutines (the operator API) keep
// getting CPU. After the handshake the connection reads straight through.
//
// While nonblock is set (by the goroutine that reads: muxConn.readNext)
// it reads nothing: a read through its tls.Conn then returns only what
// crypto/tls has buffered.
type gatedConn struct {
	net.Conn
	cpu      chan struct{}
	held     bool // a slot; only the handshake's goroutine reads before done
	done     atomic.Bool
	nonblock bool
}

func (c *gatedConn) Read(b []byte) (int, error) {
	if c.done.Load() {
		if c.nonblock {
			return 0, errWouldBlock
		}
		return c.Conn.Read(b)
	}
	c.release()
	n, err := c.Conn.Read(b)
	if err == nil {
		c.cpu <- struct{}{}
		c.held = true
	}
	return n, err
}

func (c *gatedConn) release() {
	if c.held {
		<-c.cpu
		c.held = false
	}
}

// handshakeDone gives the slot back for good.
func (c *gatedConn) handshakeDone() {
	c.release()
	c.done.Store(true)
}
