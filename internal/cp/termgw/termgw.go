// Package termgw is the browser terminal gateway: it mints single-use
// terminal tokens for allocations, accepts the browser's WebSocket, queues
// terminal.open for the session's node, accepts the node's stream (mTLS,
// the session's nonce), pumps the two legs together (with recording), and
// ends sessions whose host, allocation or minting token goes away.
package termgw

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
)

// Refusal of a node's session cap.
const (
	codeTerminalLimit = "terminal_session_limit"
	// terminalRetryAfter is the Retry-After (seconds) of a mint refused with
	// terminal_session_limit.
	terminalRetryAfter = 10
)

// Store is what the gateway reads and writes: the terminal sessions and
// their tokens, and the records a session names. store.Store satisfies it.
type Store interface {
	store.TerminalStore
	GetAllocation(ctx context.Context, id string) (store.Allocation, error)
	GetInstance(ctx context.Context, id string) (store.Instance, error)
	GetSliceWorkflow(ctx context.Context, allocationID string) (store.SliceWorkflow, error)
	GetHost(ctx context.Context, id string) (store.Host, error)
	GetOperatorToken(ctx context.Context, id string) (store.OperatorToken, error)
	GetTask(ctx context.Context, id string) (store.Task, error)
	CancelTask(ctx context.Context, id string, now time.Time, audit func(store.Task) []store.AuditEvent) (store.Task, error)
}

// Nodes says whether a node's agent is heard from and allowed in.
type Nodes interface {
	NodeOnline(ctx context.Context, id string) bool
}

// Tasks queues a task (terminal.open) for a node.
type Tasks interface {
	Enqueue(ctx context.Context, t store.Task) error
}

// Metrics are the gateway's series, registered by the control plane.
type Metrics struct {
	Mints, Sessions, NodeStreams, Revoked *prometheus.CounterVec
	OpenSeconds                           prometheus.Histogram
	// LimitRefusals counts refusals by a per-node cap, by code.
	LimitRefusals *prometheus.CounterVec
}

// Gateway is this replica's terminal gateway.
type Gateway struct {
	cfg     Config
	store   Store
	nodes   Nodes
	tasks   Tasks
	audit   *audit.Log
	metrics Metrics
	log     *slog.Logger
	now     func() time.Time
	// term holds this replica's live sessions.
	term *termGateway
	// baseCtx ends when the control plane stops; sessions (hijacked
	// connections) end with it. Set by Start.
	baseCtx context.Context
}

// New is a gateway; cfg has its defaults set (Config.SetDefaults).
func New(cfg Config, st Store, nodes Nodes, tasks Tasks, auditLog *audit.Log, m Metrics, log *slog.Logger, now func() time.Time) *Gateway {
	return &Gateway{cfg: cfg, store: st, nodes: nodes, tasks: tasks, audit: auditLog, metrics: m, log: log, now: now,
		term: newTermGateway()}
}

// Start sets the context live sessions end with; call it before serving.
// It also starts renewing this replica's session leases and sweeping the
// expired ones of replicas that died.
func (s *Gateway) Start(ctx context.Context) {
	s.baseCtx = ctx
	go s.runLeases(ctx)
}

// Count is the number of live sessions this replica holds a browser for.
func (s *Gateway) Count() int { return s.term.count() }

// CloseAllocation ends the live sessions of an allocation.
func (s *Gateway) CloseAllocation(id string) { s.term.CloseAllocation(id) }
