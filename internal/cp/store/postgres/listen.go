package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// Reconnect backoff of the LISTEN connection.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 5 * time.Second
)

var errClosed = errors.New("postgres: store closed")

// listener owns the one LISTEN connection of a Store (a plain pgx.Conn, not
// a pool connection, since it is held for the Store's lifetime) and
// publishes what it receives to the hub.
type listener struct {
	cfg    *pgx.ConnConfig
	hub    *sqlstore.Broadcaster
	ctx    context.Context // the Store's lifetime
	cancel context.CancelFunc

	mu      sync.Mutex
	started bool
	closed  bool
	done    chan struct{}

	// listening is whether the LISTEN connection is up; reconnects counts
	// the times it was re-established after dropping.
	listening  atomic.Bool
	reconnects atomic.Uint64
}

func newListener(cfg *pgx.ConnConfig, hub *sqlstore.Broadcaster) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{cfg: cfg, hub: hub, ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// start opens the connection and begins listening, once; ctx bounds only
// the first connection attempt.
func (l *listener) start(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	if l.started {
		return nil
	}
	conn, err := l.connect(ctx)
	if err != nil {
		return err
	}
	l.started = true
	l.listening.Store(true)
	go l.run(conn)
	return nil
}

func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `LISTEN `+Channel); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

func (l *listener) run(conn *pgx.Conn) {
	defer close(l.done)
	backoff := minBackoff
	for {
		if conn == nil {
			t := time.NewTimer(backoff)
			select {
			case <-l.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			c, err := l.connect(l.ctx)
			if err != nil {
				backoff = min(2*backoff, maxBackoff)
				continue
			}
			conn, backoff = c, minBackoff
			l.listening.Store(true)
			l.reconnects.Add(1)
			// Whatever was committed while the connection was down was
			// never delivered: every consumer re-reads.
			l.hub.Publish(store.Event{Kind: store.EventResync})
		}
		n, err := conn.WaitForNotification(l.ctx)
		if err != nil {
			l.listening.Store(false)
			closeConn(conn)
			conn = nil
			if l.ctx.Err() != nil {
				return
			}
			continue
		}
		if ev, ok := parsePayload(n.Payload); ok {
			l.hub.Publish(ev)
		}
	}
}

// close stops the listener and waits for it.
func (l *listener) close() {
	l.mu.Lock()
	started := l.started
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	if started {
		<-l.done
	}
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// parsePayload reads "<kind>:<id>"; ids may contain ':'.
func parsePayload(p string) (store.Event, bool) {
	kind, id, ok := strings.Cut(p, ":")
	if !ok {
		return store.Event{}, false
	}
	return store.Event{Kind: store.EventKind(kind), ID: id}, true
}
