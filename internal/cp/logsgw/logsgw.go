// Package logsgw streams a workload's logs from its node to an operator:
// GET /api/v1/instances/{id}/logs checks the instance, queues the internal
// task logs.open for the instance's node, waits (bounded) for the node to
// dial the node-facing logs stream (node certificate plus the session's
// single-use nonce, the same shape as the terminal gateway), then relays
// the node's frames (internal/wire/logstream) to the client as text/plain
// or as server-sent events.
//
// Memory is bounded on this hop: one frame (logstream.MaxFrame) in flight.
// The relay reads the next frame only once the previous one was written
// and flushed to the client, so a slow client stops the reads from the
// node's WebSocket, whose TCP window then stops the agent's writes and so
// its reads from the log. When the client goes, the request context ends
// and the node's stream is closed, which closes the log on the node.
package logsgw

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
)

// Config configures the gateway; zero fields take the documented defaults.
type Config struct {
	// DispatchTimeout bounds the wait for the node to pick up logs.open
	// (default 10s): 504 logs_dispatch_timeout.
	DispatchTimeout time.Duration
	// StreamTimeout bounds the wait for the node's stream from the request
	// on (default 15s): 504 logs_node_stream_timeout.
	StreamTimeout time.Duration
	// MaxFollow is the longest a follow stream lives (default 4h); the
	// client reconnects with since= after it.
	MaxFollow time.Duration
	// MaxRead bounds a stream without follow (default 5m).
	MaxRead time.Duration
	// MaxStreamsPerNode caps one node's streams on this replica
	// (default 8): 429 logs_stream_limit_node.
	MaxStreamsPerNode int
	// MaxStreams caps this replica's streams (default 64): 429
	// logs_stream_limit_replica.
	MaxStreams int
	// AdvertiseURL is this replica's own node-facing base URL: logs.open
	// carries it as stream_url (signed) so the node's stream reaches this
	// replica ("": agents dial their configured URL).
	AdvertiseURL string
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DispatchTimeout, 10*time.Second)
	def(&c.StreamTimeout, 15*time.Second)
	def(&c.MaxFollow, 4*time.Hour)
	def(&c.MaxRead, 5*time.Minute)
	if c.MaxStreamsPerNode <= 0 {
		c.MaxStreamsPerNode = 8
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = 64
	}
}

// Store is what the gateway reads: the instance, and the logs.open task.
type Store interface {
	GetInstance(ctx context.Context, id string) (store.Instance, error)
	GetInstanceByName(ctx context.Context, name string) (store.Instance, error)
	GetTask(ctx context.Context, id string) (store.Task, error)
	CancelTask(ctx context.Context, id string, now time.Time, audit func(store.Task) []store.AuditEvent) (store.Task, error)
}

// Nodes says whether a node's agent is heard from.
type Nodes interface {
	NodeOnline(ctx context.Context, id string) bool
}

// Tasks queues logs.open.
type Tasks interface {
	Enqueue(ctx context.Context, t store.Task) error
}

// Gateway is this replica's logs gateway.
type Gateway struct {
	cfg   Config
	store Store
	nodes Nodes
	tasks Tasks
	audit *audit.Log
	log   *slog.Logger
	now   func() time.Time

	mu     sync.Mutex
	byID   map[string]*session
	byNode map[string]int
}

// New is a gateway; cfg's zero fields take their defaults.
func New(cfg Config, st Store, nodes Nodes, tasks Tasks, auditLog *audit.Log, log *slog.Logger, now func() time.Time) *Gateway {
	cfg.SetDefaults()
	return &Gateway{cfg: cfg, store: st, nodes: nodes, tasks: tasks, audit: auditLog, log: log, now: now,
		byID: map[string]*session{}, byNode: map[string]int{}}
}

// session is one log stream this replica waits for or relays.
type session struct {
	id, nodeID, nonce string
	node              chan *websocket.Conn // the node's stream, handed over once
	done              chan struct{}        // closed when the session ended
	attached          atomic.Bool
}

// Count is the number of streams this replica holds.
func (g *Gateway) Count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.byID)
}

// add registers l; code is the limit that refused it.
func (g *Gateway) add(l *session) (code string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case len(g.byID) >= g.cfg.MaxStreams:
		return codeLimitReplica
	case g.byNode[l.nodeID] >= g.cfg.MaxStreamsPerNode:
		return codeLimitNode
	}
	g.byID[l.id] = l
	g.byNode[l.nodeID]++
	return ""
}

func (g *Gateway) remove(l *session) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byID[l.id] != l {
		return
	}
	delete(g.byID, l.id)
	if g.byNode[l.nodeID]--; g.byNode[l.nodeID] <= 0 {
		delete(g.byNode, l.nodeID)
	}
}

func (g *Gateway) get(id string) *session {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byID[id]
}
