// Package store owns the control plane's persistent state: the Store port,
// its models and its sentinel errors. The adapters live in sub-packages
// (sqlite, postgres) and share one SQL implementation (sqlstore) and one set
// of embedded migrations (migrations). This package must not know about HTTP,
// TLS or task semantics beyond the state machine the queries enforce.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Sentinel errors; adapters wrap them with context.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
)

// Host is a host record. TokenHash is the SHA-256 of the bootstrap token;
// the token itself is never stored.
type Host struct {
	ID             string
	OSFamily       string
	Labels         map[string]string
	Enabled        bool
	Revoked        bool
	Draining       bool // no new instances are placed here
	Status         api.HostStatus
	StatusReason   string
	Hostname       string
	SelectedAccel  string
	AgentVersion   string
	Capabilities   json.RawMessage // api.Capabilities, or nil
	Capacity       json.RawMessage // api.Capacity, or nil
	TokenHash      string          // hex SHA-256; "" when no token is outstanding
	TokenExpiresAt time.Time
	TokenUsed      bool
	CertSerial     string
	CertNotAfter   time.Time
	EnrolledAt     time.Time
	LastSeenAt     time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

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
	NodeID string
	State  api.TaskState
	Limit  int // default 100
}

// OperatorToken is an operator API credential; only its hash is stored.
// Names are unique.
type OperatorToken struct {
	ID        string
	Name      string
	Role      api.Role
	TokenHash string
	CreatedAt time.Time
	ExpiresAt time.Time // zero: no expiry
	Revoked   bool
}

// AuditEvent is one append-only audit record.
type AuditEvent struct {
	ID            int64
	At            time.Time
	Actor         string
	ActorTokenID  string   // the operator token behind Actor, if any
	ActorRole     api.Role // that token's role when it acted
	Action        string
	Target        string
	Result        string
	CorrelationID string
	Detail        string
}

// AuditFilter narrows ListAudit. Zero fields do not filter.
type AuditFilter struct {
	Target        string
	CorrelationID string
	Limit         int // default 100
}

// SigningKey is a task-signing key pair. PrivateKey is the PKCS#8 DER of an
// Ed25519 key. Retired keys are kept in the JWKS until RetiredAt + grace.
type SigningKey struct {
	KID        string
	PrivateKey []byte
	CreatedAt  time.Time
	RetiredAt  time.Time // zero while active
}

// Slot is a node resource slot an operator approved from a
// slice.topology_discover candidate. Spec is the candidate as discovered.
type Slot struct {
	HostID     string
	SlotID     string
	Index      int
	Spec       json.RawMessage
	SourceTask string // the discovery task it was approved from
	ApprovedBy string
	ApprovedAt time.Time
}

// Instance is a declarative VM instance: the operator sets Spec and
// DesiredState (each change bumps Generation); the agent of HostID reports
// Phase, ReasonCode, Message, Runtime and the generation it acted on.
type Instance struct {
	ID                 string
	Name               string // unique among all instance records
	Group              string // "" when not in a group
	HostID             string
	Labels             map[string]string
	Spec               json.RawMessage // api.InstanceSpec
	DesiredState       api.DesiredState
	Generation         int64 // bumped on every spec or desired-state change
	Phase              api.InstancePhase
	ReasonCode         api.ReasonCode
	Message            string
	ObservedGeneration int64
	Runtime            json.RawMessage // api.InstanceRuntime, or nil
	CreatedBy          string
	CreatedAt          time.Time
	UpdatedAt          time.Time
	StatusAt           time.Time // zero until the agent reports
}

// InstanceFilter narrows ListInstances. Zero fields do not filter.
type InstanceFilter struct {
	HostID string
	Group  string
}

// Allocation binds a user to a host (bare metal) or to an instance on
// HostID. Spec is the api.CreateAllocationRequest it was created from (SSH
// keys, shell, sudo), kept so a release can name the user it provisioned.
type Allocation struct {
	ID              string
	Username        string
	HostID          string
	InstanceID      string // "" for host allocations
	State           api.AllocationState
	StateReason     string
	Spec            json.RawMessage
	ProvisionTaskID string
	ReleaseTaskID   string
	CreatedBy       string
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// AllocationFilter narrows ListAllocations. Zero fields do not filter.
type AllocationFilter struct {
	HostID     string
	InstanceID string
	State      api.AllocationState
}

// TerminalSession is one browser terminal session, created when its token
// is minted. Only the token's SHA-256 is stored. States is the JSON array of
// api.TerminalStateEvent the gateway appends to as the session passes the
// readiness hops (terminal.State); State is the last of them.
type TerminalSession struct {
	ID             string
	AllocationID   string
	NodeID         string
	Username       string
	Mode           string // "pty" or "serial"
	InstanceID     string
	TokenHash      string
	TokenExpiresAt time.Time
	TokenUsedAt    time.Time // zero until redeemed
	State          string
	States         json.RawMessage
	ErrorCode      string
	ErrorMessage   string
	TaskID         string
	CorrelationID  string
	Cols, Rows     int
	CreatedBy      string
	CreatedAt      time.Time
	ClosedAt       time.Time // zero while open
	ExitCode       int
	Exited         bool // ExitCode is meaningful
	CloseReason    string
	RecordingPath  string // "" until recording started
	RecordingBytes int64

	// MintedByTokenID is the id of the operator token that minted the
	// session's terminal token ("" when unknown); revoking that token ends
	// the session.
	MintedByTokenID string
}

// TerminalSessionFilter narrows ListTerminalSessions. Zero fields do not
// filter. Sessions come newest first.
type TerminalSessionFilter struct {
	AllocationID string
	NodeID       string
	Limit        int // default 100
}

// Seen is one coalesced heartbeat observation.
type Seen struct {
	HostID string
	At     time.Time
}

// Event is a change notification delivered to every replica.
type Event struct {
	Kind EventKind
	// ID is the node id for task events, the host id for host events, the
	// id of the instance's host for instance events, the allocation id for
	// allocation events and the token id for operator token events.
	ID string
}

// EventKind says what changed.
type EventKind string

// Event kinds.
const (
	EventTask EventKind = "task" // a task became claimable for node ID
	EventHost EventKind = "host" // host ID's record changed (disable, revoke, drain, ...)
	// EventInstance: an instance assigned to host ID was created, changed or
	// removed.
	EventInstance EventKind = "instance"
	// EventAllocation: allocation ID changed (released, failed, ...).
	EventAllocation EventKind = "allocation"
	// EventOperatorToken: operator token ID was revoked.
	EventOperatorToken EventKind = "operator_token"
)

// Store is the persistence port of the control plane. Every method is safe
// for concurrent use by several replicas sharing one database.
type Store interface {
	// CreateHost inserts a host; ErrConflict if the id exists.
	CreateHost(ctx context.Context, h Host) error
	// GetHost returns a host or ErrNotFound.
	GetHost(ctx context.Context, id string) (Host, error)
	// ListHosts returns all hosts ordered by id.
	ListHosts(ctx context.Context) ([]Host, error)
	// UpdateHost reads the host, applies fn and writes the result in one
	// transaction that locks the row; if fn returns an error nothing is
	// written and that error is returned. Publishes EventHost.
	UpdateHost(ctx context.Context, id string, fn func(*Host) error) (Host, error)
	// TouchHosts records coalesced heartbeats: LastSeenAt is raised (never
	// lowered) and a host whose status is stale or unknown becomes healthy.
	// It returns the ids whose status changed.
	TouchHosts(ctx context.Context, seen []Seen) (revived []string, err error)
	// MarkStale sets status stale on heartbeating hosts (healthy,
	// task_result_failed, api_unreachable) last seen before cutoff and returns
	// their ids.
	MarkStale(ctx context.Context, cutoff time.Time) ([]string, error)

	// EnqueueTask inserts a queued task and publishes EventTask for its node
	// (in the same transaction where the database supports it).
	EnqueueTask(ctx context.Context, t Task) error
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
	// StartTask moves a dispatched task of nodeID to running and extends its
	// lease. Running tasks only extend the lease. ErrNotFound if the task does
	// not belong to nodeID; ErrConflict if it is terminal.
	StartTask(ctx context.Context, nodeID, taskID string, leaseUntil time.Time) (Task, error)
	// CompleteTask records a result for a task of nodeID. Posting a result
	// with the same hash again returns the task unchanged; a different result
	// for a terminal task is ErrConflict. ErrNotFound if the task does not
	// belong to nodeID.
	CompleteTask(ctx context.Context, nodeID, taskID string, state api.TaskState, result json.RawMessage, resultHash string, at time.Time) (Task, error)
	// CancelTask cancels a task that is not terminal; ErrConflict otherwise.
	CancelTask(ctx context.Context, id string, at time.Time) (Task, error)
	// ReapTasks requeues dispatched or running tasks whose lease ended before
	// now (publishing EventTask) and expires unfinished tasks whose
	// ExpiresAt is before now.
	ReapTasks(ctx context.Context, now time.Time) (requeued, expired []Task, err error)
	// AddTaskEvent appends a progress event; Seq is assigned by the store.
	AddTaskEvent(ctx context.Context, e TaskEvent) error
	// ListTaskEvents returns a task's events in order.
	ListTaskEvents(ctx context.Context, taskID string) ([]TaskEvent, error)

	// CreateOperatorToken inserts a token; ErrConflict on duplicate id,
	// hash or name.
	CreateOperatorToken(ctx context.Context, t OperatorToken) error
	// GetOperatorTokenByHash returns a token or ErrNotFound.
	GetOperatorTokenByHash(ctx context.Context, hash string) (OperatorToken, error)
	// GetOperatorToken returns a token by id or ErrNotFound.
	GetOperatorToken(ctx context.Context, id string) (OperatorToken, error)
	// ListOperatorTokens returns all tokens, oldest first.
	ListOperatorTokens(ctx context.Context) ([]OperatorToken, error)
	// RevokeOperatorToken marks a token revoked; ErrNotFound if absent.
	// Publishes EventOperatorToken.
	RevokeOperatorToken(ctx context.Context, id string) error

	// AppendAudit appends an audit record.
	AppendAudit(ctx context.Context, e AuditEvent) error
	// ListAudit returns audit records newest first.
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, error)

	// PutSecretIfAbsent stores value under name unless a value exists, and
	// returns the stored value either way (first writer wins across replicas).
	PutSecretIfAbsent(ctx context.Context, name string, value []byte) ([]byte, error)
	// AddSigningKey inserts a signing key; ErrConflict on duplicate kid.
	AddSigningKey(ctx context.Context, k SigningKey) error
	// ListSigningKeys returns all signing keys, oldest first.
	ListSigningKeys(ctx context.Context) ([]SigningKey, error)
	// RetireSigningKeys sets RetiredAt on every active key except keepKID.
	RetireSigningKeys(ctx context.Context, keepKID string, at time.Time) error
	// GetSecret returns a secret's stored value or ErrNotFound.
	GetSecret(ctx context.Context, name string) ([]byte, error)
	// ReplaceSecret sets the secret name to value if it still holds old
	// (encryption at rest in place): ErrNotFound if absent, ErrConflict if
	// its value is no longer old.
	ReplaceSecret(ctx context.Context, name string, old, value []byte) error
	// ReplaceSigningKey sets the private key of kid to priv if it still is
	// old, like ReplaceSecret.
	ReplaceSigningKey(ctx context.Context, kid string, old, priv []byte) error

	// ApproveSlots records approved slots atomically; ErrConflict if any
	// (host, slot id) is already approved.
	ApproveSlots(ctx context.Context, slots []Slot) error
	// ListSlots returns a host's approved slots by index.
	ListSlots(ctx context.Context, hostID string) ([]Slot, error)
	// DeleteSlot removes an approved slot; ErrNotFound if absent.
	DeleteSlot(ctx context.Context, hostID, slotID string) error

	// CreateInstance inserts an instance; ErrConflict if the id or the name
	// exists. Publishes EventInstance for its host.
	CreateInstance(ctx context.Context, in Instance) error
	// GetInstance returns an instance or ErrNotFound.
	GetInstance(ctx context.Context, id string) (Instance, error)
	// GetInstanceByName returns an instance or ErrNotFound.
	GetInstanceByName(ctx context.Context, name string) (Instance, error)
	// ListInstances returns instances ordered by name.
	ListInstances(ctx context.Context, f InstanceFilter) ([]Instance, error)
	// UpdateInstance reads the instance, applies fn and writes the result in
	// one transaction that locks the row, like UpdateHost; ErrConflict if fn
	// renames it to a taken name. Publishes EventInstance for its host (both
	// hosts when fn moves it).
	UpdateInstance(ctx context.Context, id string, fn func(*Instance) error) (Instance, error)
	// DeleteInstance removes an instance record; ErrNotFound if absent.
	// Publishes EventInstance for its host.
	DeleteInstance(ctx context.Context, id string) error

	// CreateAllocation inserts an allocation; ErrConflict if the id exists.
	CreateAllocation(ctx context.Context, a Allocation) error
	// GetAllocation returns an allocation or ErrNotFound.
	GetAllocation(ctx context.Context, id string) (Allocation, error)
	// ListAllocations returns allocations, oldest first.
	ListAllocations(ctx context.Context, f AllocationFilter) ([]Allocation, error)
	// UpdateAllocation applies fn to the allocation in one transaction and
	// sets UpdatedAt to the value fn leaves; ErrNotFound if it does not
	// exist. An error from fn aborts the update and is returned. Publishes
	// EventAllocation.
	UpdateAllocation(ctx context.Context, id string, fn func(*Allocation) error) (Allocation, error)

	// CreateTerminalSession inserts a session; ErrConflict if the id or the
	// token hash exists.
	CreateTerminalSession(ctx context.Context, s TerminalSession) error
	// GetTerminalSession returns a session or ErrNotFound.
	GetTerminalSession(ctx context.Context, id string) (TerminalSession, error)
	// RedeemTerminalToken atomically burns the token with this hash and
	// returns its session with TokenUsedAt = now: ErrNotFound when no
	// session has this hash, ErrConflict when it was already redeemed (on
	// any replica). Expired tokens are burned too; the caller checks
	// TokenExpiresAt.
	RedeemTerminalToken(ctx context.Context, tokenHash string, now time.Time) (TerminalSession, error)
	// UpdateTerminalSession applies fn to the session in one transaction;
	// ErrNotFound if it does not exist. An error from fn aborts the update.
	UpdateTerminalSession(ctx context.Context, id string, fn func(*TerminalSession) error) (TerminalSession, error)
	// ListTerminalSessions returns sessions, newest first.
	ListTerminalSessions(ctx context.Context, f TerminalSessionFilter) ([]TerminalSession, error)

	// Subscribe delivers change events from every replica until ctx ends.
	// Delivery is best-effort and may coalesce; consumers re-read the store.
	Subscribe(ctx context.Context) (<-chan Event, error)
	// Ping checks the database is reachable (for /readyz).
	Ping(ctx context.Context) error
	// Close releases the database.
	Close() error
}
