package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Task is a queued unit of work for one node.
type Task struct {
	ID             string
	NodeID         string
	Type           string
	Params         json.RawMessage
	State          api.TaskState
	CorrelationID  string
	CreatedBy      string
	Attempts       int
	CreatedAt      time.Time
	ExpiresAt      time.Time
	DispatchedAt   time.Time       // zero until claimed
	LeaseExpiresAt time.Time       // zero unless dispatched or running
	FinishedAt     time.Time       // zero until terminal
	Result         json.RawMessage // api.TaskResult, or nil
	ResultHash     string          // hex SHA-256 of the canonical result
}

// TaskEvent is a progress event recorded for a task.
type TaskEvent struct {
	TaskID string
	Seq    int64
	At     time.Time
	Event  json.RawMessage // api.TaskEvent
}

// TaskFilter narrows ListTasks. Zero fields do not filter.
type TaskFilter struct {
	NodeID        string
	Type          string
	State         api.TaskState
	CorrelationID string
	Limit         int // default 100
}

// ClaimLeases are the leases a claim may set: ByType[type] for a task of a
// type listed there, Default for any other.
type ClaimLeases struct {
	Default time.Time
	ByType  map[string]time.Time
}

// TaskStore is the task queue and its progress events: the tasks room
// (cp/tasks: enqueue, claim, results, the reaper) embeds it whole; the
// hosts and termgw rooms read or cancel tasks through narrower interfaces
// of their own.
type TaskStore interface {
	// EnqueueTask inserts a queued task and publishes EventTask for its node
	// (in the same transaction where the database supports it), with the
	// audit records that describe it: a claim can never be recorded before
	// its task's enqueue (ADR 0016).
	EnqueueTask(ctx context.Context, t Task, audit ...AuditEvent) error
	// InsertTasks enqueues tasks as EnqueueTask does, all in one
	// transaction with the audit records: either every task and record is
	// stored (and EventTask published once per node) or none is (a duplicate
	// id is ErrConflict).
	InsertTasks(ctx context.Context, ts []Task, audit ...AuditEvent) error
	// GetTask returns a task or ErrNotFound.
	GetTask(ctx context.Context, id string) (Task, error)
	// ListTasks returns tasks newest first.
	ListTasks(ctx context.Context, f TaskFilter) ([]Task, error)
	// ClaimTask atomically moves the oldest queued, unexpired task of nodeID
	// to dispatched, sets its lease and increments Attempts. ok is false when
	// there is none, and when nodeID's host record is disabled or revoked
	// (its tasks stay queued). Safe against concurrent claimers on other
	// replicas.
	ClaimTask(ctx context.Context, nodeID string, now, leaseUntil time.Time) (t Task, ok bool, err error)
	// ClaimTaskLeases is ClaimTask with the lease chosen by the claimed
	// task's type (in the same statement).
	ClaimTaskLeases(ctx context.Context, nodeID string, now time.Time, leases ClaimLeases) (t Task, ok bool, err error)
	// ClaimTasks is ClaimTaskLeases for up to max tasks of nodeID at once,
	// in one statement: the oldest first, none when the host is disabled or
	// revoked, each claimed by one caller only. max < 1 is one. audit (nil:
	// none) gives the records of the tasks claimed, which are stored in the
	// claim's transaction (none when nothing was claimed); it runs inside
	// the transaction and must not call the store.
	ClaimTasks(ctx context.Context, nodeID string, now time.Time, leases ClaimLeases, max int,
		audit func([]Task) []AuditEvent) ([]Task, error)
	// QueuedTaskNodes returns the distinct node ids with a queued task that
	// has not expired at now and that ClaimTasks would hand out (not of a
	// disabled or revoked host): the long-poll fallback wakes those of its
	// parked nodes, in case their change event was lost.
	QueuedTaskNodes(ctx context.Context, now time.Time) ([]string, error)
	// StartTask moves a dispatched task of nodeID to running and extends its
	// lease. Running tasks only extend the lease. ErrNotFound if the task does
	// not belong to nodeID; ErrConflict if it is terminal.
	StartTask(ctx context.Context, nodeID, taskID string, leaseUntil time.Time) (Task, error)
	// CompleteTask records a result for a task of nodeID. Posting a result
	// with the same hash again returns the task unchanged; a different result
	// for a terminal task is ErrConflict. ErrNotFound if the task does not
	// belong to nodeID. audit (nil: none) gives the records of the result
	// applied, which are stored in its transaction (none for a replay); it
	// runs inside the transaction and must not call the store.
	CompleteTask(ctx context.Context, nodeID, taskID string, state api.TaskState, result json.RawMessage, resultHash string,
		at time.Time, audit func(Task) []AuditEvent) (Task, error)
	// CancelTask cancels a task that is not terminal; ErrConflict otherwise.
	// The records audit (when not nil) returns for the canceled task are
	// appended in the same transaction; it must not call the store.
	CancelTask(ctx context.Context, id string, at time.Time, audit func(Task) []AuditEvent) (Task, error)
	// ReapTasks requeues dispatched or running tasks whose lease ended before
	// now (publishing EventTask) and expires unfinished tasks whose
	// ExpiresAt is before now. The records audit (when not nil) returns for
	// them are appended in the same transaction, so that none is missing
	// when the requeued task is claimed again; it must not call the store.
	ReapTasks(ctx context.Context, now time.Time, audit func(requeued, expired []Task) []AuditEvent) (requeued, expired []Task, err error)
	// AddTaskEvent appends a progress event; Seq is assigned by the store.
	AddTaskEvent(ctx context.Context, e TaskEvent) error
	// ListTaskEvents returns a task's events in order.
	ListTaskEvents(ctx context.Context, taskID string) ([]TaskEvent, error)
}
