package nodeapi

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// MaxTicketFailures is how many failed handshakes in a row drop a TLS
// session ticket from a SessionCache.
const MaxTicketFailures = 3

// SessionCache is the TLS session-ticket cache of a node API client: an
// LRU cache (tls.NewLRUClientSessionCache) that keeps a ticket through
// transient handshake failures. crypto/tls deletes (Put with nil) the ticket
// a failed handshake offered, whatever failed; after a control-plane restart
// most failures are timeouts of an overloaded server, and a deleted ticket
// makes the next attempt a full handshake, which loads the server further.
// So a ticket goes only after MaxTicketFailures failed handshakes in a row:
// a ticket the server cannot use (the control plane then answers with a
// full handshake, not a failure) costs at most that many attempts.
type SessionCache struct {
	lru tls.ClientSessionCache

	mu    sync.Mutex
	fails map[string]int
}

// NewSessionCache holds up to capacity tickets.
func NewSessionCache(capacity int) *SessionCache {
	return &SessionCache{lru: tls.NewLRUClientSessionCache(capacity), fails: map[string]int{}}
}

// Get implements tls.ClientSessionCache.
func (c *SessionCache) Get(key string) (*tls.ClientSessionState, bool) { return c.lru.Get(key) }

// Put implements tls.ClientSessionCache.
func (c *SessionCache) Put(key string, cs *tls.ClientSessionState) {
	c.mu.Lock()
	if cs == nil {
		c.fails[key]++
		if c.fails[key] < MaxTicketFailures {
			c.mu.Unlock()
			return
		}
	}
	delete(c.fails, key)
	c.mu.Unlock()
	c.lru.Put(key, cs)
}

// ClientHandshake runs the client side of a TLS handshake with the
// control plane on raw, as http.Transport would for addr: cfg (which it
// modifies: pass a clone) gets addr's host as ServerName when it has none
// and offers protos in ALPN (none given: HTTP/2 first, then HTTP/1.1). On
// failure raw is closed.
func ClientHandshake(ctx context.Context, raw net.Conn, cfg *tls.Config, addr string, timeout time.Duration,
	protos ...string) (*tls.Conn, error) {
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg.ServerName = host
	}
	cfg.NextProtos = protos
	if len(protos) == 0 {
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(hctx); err != nil {
		_ = raw.Close()
		return nil, err
	}
	return tc, nil
}
