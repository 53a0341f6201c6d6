// Package tasks owns the task queue: the operator's task routes (enqueue,
// list, show with its events, cancel, the task types), the node's task
// routes (the claim long-poll with signing and delivery, progress events,
// results), the lease reaper, and the task event bus the other rooms
// subscribe to (terminal.open, the allocation user tasks). Other rooms
// queue their tasks through NewTask and Enqueue. It must not authenticate
// callers (the server mounts its handlers behind operator or node auth),
// run anything on behalf of nodes, or keep tasks anywhere but the Store.
package tasks

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Store is what the tasks room reads and writes: the whole task queue, and
// a node's host record. store.Store satisfies it.
type Store interface {
	store.TaskStore
	GetHost(ctx context.Context, id string) (store.Host, error)
}

// Nodes says whether a node's identity was revoked (a woken long-poll
// re-checks it).
type Nodes interface {
	NodeRevoked(ctx context.Context, id string) (bool, error)
}

// Slots checks the slots a slice task names against the node's approved
// ones (instances.Room.SliceSlotFields).
type Slots interface {
	SliceSlotFields(ctx context.Context, nodeID, typ string, params json.RawMessage) ([]api.FieldError, error)
}

// Signer signs a claimed task's envelope (keys.Keys) and names the key it
// signs with now.
type Signer interface {
	Sign(c api.TaskClaims) (string, error)
	SigningKID() string
}

// Metrics are the room's series, registered by the control plane.
type Metrics struct {
	Enqueued, Claimed, Requeued, Expired prometheus.Counter
	// Results counts node results by final state.
	Results *prometheus.CounterVec
}

// Config configures the room.
type Config struct {
	// Registry lists the task types accepted.
	Registry *task.Registry
	// MaxWait caps the node's claim long-poll.
	MaxWait time.Duration
	// FallbackPoll is how often RunFallback re-checks the queue for the
	// nodes parked on this replica, in case a change event was lost (0:
	// RunFallback returns at once).
	FallbackPoll time.Duration
	Log          *slog.Logger
	Now          func() time.Time
}

// Room is this replica's task queue.
type Room struct {
	cfg     Config
	store   Store
	nodes   Nodes
	slots   Slots
	signer  Signer
	audit   *audit.Log
	metrics Metrics
	log     *slog.Logger
	// waiters wakes the claim long-polls of a node.
	waiters *httpapi.Waiters
	// bus carries task events (claimed, finished) to the consumers
	// subscribed by task type.
	bus *taskbus.Bus
}

// New is the tasks room, with an empty event bus (Bus).
func New(cfg Config, st Store, nodes Nodes, slots Slots, signer Signer, auditLog *audit.Log, m Metrics) *Room {
	return &Room{cfg: cfg, store: st, nodes: nodes, slots: slots, signer: signer, audit: auditLog, metrics: m,
		log: cfg.Log, waiters: httpapi.NewWaiters(), bus: taskbus.New()}
}

// Bus is the task event bus consumers subscribe to before serving.
func (s *Room) Bus() *taskbus.Bus { return s.bus }

// Wake wakes the claim long-polls of a node on this replica (a task or
// host change event).
func (s *Room) Wake(nodeID string) { s.waiters.Wake(nodeID) }

// WakeAll wakes every claim long-poll on this replica: change events may
// have been lost (store.EventResync).
func (s *Room) WakeAll() { s.waiters.WakeAll() }

// NewTask builds a queued task created by the control plane on behalf of
// the caller.
func (s *Room) NewTask(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task {
	now := s.cfg.Now().UTC()
	return store.Task{ID: httpapi.NewID("tsk_"), NodeID: nodeID, Type: typ, Params: params, State: api.TaskQueued,
		CorrelationID: httpapi.CorrelationID(ctx), CreatedBy: orSystem(httpapi.Actor(ctx)), CreatedAt: now, ExpiresAt: now.Add(ttl)}
}

// Enqueue stores t with its audit record and wakes its node's long-poll on
// this replica (same replica: no wait for the event's round trip).
func (s *Room) Enqueue(ctx context.Context, t store.Task) error {
	rec := s.audit.Event(ctx, audit.Entry{Actor: t.CreatedBy, Action: "task.enqueue", Target: t.ID, Result: "queued",
		CID: t.CorrelationID, Detail: "node=" + t.NodeID + " type=" + t.Type})
	if err := s.store.EnqueueTask(ctx, t, rec); err != nil {
		return err
	}
	s.waiters.Wake(t.NodeID)
	s.metrics.Enqueued.Inc()
	return nil
}

func orSystem(a string) string {
	if a == "" {
		return "system"
	}
	return a
}

// taskDispatched publishes that a node claimed t.
func (s *Room) taskDispatched(ctx context.Context, t store.Task) {
	s.bus.PublishDispatched(ctx, taskbus.Dispatched{Task: t})
}

// taskFinished publishes that t reached a final state on this replica (a
// node's result, or the reaper's expiry).
func (s *Room) taskFinished(ctx context.Context, t store.Task) {
	e := taskbus.Finished{Task: t}
	if len(t.Result) > 0 {
		var res api.TaskResult
		if json.Unmarshal(t.Result, &res) == nil {
			e.Result = &res
		}
	}
	s.bus.PublishFinished(ctx, e)
}
