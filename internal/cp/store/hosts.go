package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
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

	// LastFailure is the host's last failure: an internal/wire/signal
	// name, its detail, correlation id and time; zero when none.
	LastFailure Failure
	// LastSuccessfulPreflightAt is when a stored preflight run for the host
	// last passed; zero when none has.
	LastSuccessfulPreflightAt time.Time
	// Profile is the environment the host's agent should use.
	Profile Profile
	// Health is what the last finished diag.health_probe said.
	Health Health
}

// HostState is the part of a host record that is read for every host
// often: what authorises a node request (enabled, revoked, when it
// enrolled), what a heartbeat is compared with so an unchanged one writes
// nothing (status, capacity, last failure) and when the host was last
// seen. The hosts room caches it; the store reads it without the large
// columns (capabilities, labels).
type HostState struct {
	ID          string
	Enabled     bool
	Revoked     bool
	Status      api.HostStatus
	EnrolledAt  time.Time
	LastSeenAt  time.Time
	Capacity    json.RawMessage // api.CapacityReport, or nil
	LastFailure Failure
	// UpdatedAt is the record's: every change to the fields above but
	// LastSeenAt sets it (ListHostStatesSince).
	UpdatedAt time.Time
}

// State is h's HostState.
func (h Host) State() HostState {
	return HostState{ID: h.ID, Enabled: h.Enabled, Revoked: h.Revoked, Status: h.Status,
		EnrolledAt: h.EnrolledAt, LastSeenAt: h.LastSeenAt, Capacity: h.Capacity, LastFailure: h.LastFailure,
		UpdatedAt: h.UpdatedAt}
}

// HostLiveness is what the health probe scheduler reads of every host
// each tick: whether it may be probed. The store reads only these columns.
type HostLiveness struct {
	ID         string
	Enabled    bool
	Revoked    bool
	Status     api.HostStatus
	LastSeenAt time.Time
}

// Liveness is h's HostLiveness.
func (h Host) Liveness() HostLiveness {
	return HostLiveness{ID: h.ID, Enabled: h.Enabled, Revoked: h.Revoked, Status: h.Status, LastSeenAt: h.LastSeenAt}
}

// Health is a host's last health probe result: State is "" before any.
type Health struct {
	State     api.HostHealth
	Summary   string
	CheckedAt time.Time
	TaskID    string
}

// HealthState is the part of a host a health probe's result changes.
type HealthState struct {
	Health      Health
	LastFailure Failure
}

// Failure is a host's last failure.
type Failure struct {
	Signal        string // an internal/wire/signal name
	Detail        string
	CorrelationID string
	At            time.Time
}

// Profile is a host's environment profile: the node-facing control plane
// (node API) URL and terminal URL its agent is expected to use; "" is not
// checked.
type Profile struct {
	APIURL      string
	TerminalURL string
}

// PreflightStatusReasonPrefix starts the status reason of a host a
// preflight run made api_unreachable.
const PreflightStatusReasonPrefix = "preflight: "

// Seen is one coalesced heartbeat observation.
type Seen struct {
	HostID string
	At     time.Time
}

// StaleMark is what MarkStale writes with one host's stale status, so
// that the status, its failure and its audit record are stored together
// or not at all (and a later transition's record never precedes it).
type StaleMark struct {
	// HeardAt, when after the cutoff, says the caller heard from the host
	// after all, by a heartbeat not yet in the store: the host keeps its
	// status and its last-seen time is raised to HeardAt.
	HeardAt time.Time
	// Failure becomes the host's last failure, when its Signal is set.
	Failure Failure
	// Audit is appended, when its Action is set.
	Audit AuditEvent
}

// HostStore is the host records: the hosts room (cp/hosts: enrolment,
// liveness, the operator host routes) embeds it whole; the tasks,
// instances, allocations and termgw rooms read hosts through narrower
// interfaces of their own.
type HostStore interface {
	// CreateHost inserts a host, with audit in its transaction;
	// ErrConflict if the id exists.
	CreateHost(ctx context.Context, h Host, audit ...AuditEvent) error
	// GetHost returns a host or ErrNotFound.
	GetHost(ctx context.Context, id string) (Host, error)
	// ListHosts returns all hosts ordered by id.
	ListHosts(ctx context.Context) ([]Host, error)
	// GetHostState returns one host's HostState, or ErrNotFound.
	GetHostState(ctx context.Context, id string) (HostState, error)
	// ListHostStates returns every host's HostState ordered by id, in one
	// read: the hosts room fills its cache with it, and reads it again
	// once a minute and after lost change events.
	ListHostStates(ctx context.Context) ([]HostState, error)
	// ListHostStatesSince returns the HostState of every host whose
	// UpdatedAt is at or after since, ordered by id: the hosts room's cache
	// refresh reads only what changed since its last read.
	ListHostStatesSince(ctx context.Context, since time.Time) ([]HostState, error)
	// ListHostLiveness returns every host's HostLiveness ordered by id: the
	// health probe scheduler reads it every tick.
	ListHostLiveness(ctx context.Context) ([]HostLiveness, error)
	// UpdateHost reads the host, applies fn and writes the result in one
	// transaction that locks the row; if fn returns an error nothing is
	// written and that error is returned. Publishes EventHost.
	UpdateHost(ctx context.Context, id string, fn func(*Host) error) (Host, error)
	// UpdateHostAudited is UpdateHost that also appends, in the same
	// transaction, the records audit returns for the host as it was read
	// and as fn left it (a status transition's record). audit runs while
	// the row is locked and must not call the store; nil records nothing.
	UpdateHostAudited(ctx context.Context, id string, fn func(*Host) error,
		audit func(before, after Host) []AuditEvent) (Host, error)
	// TouchHosts records coalesced heartbeats: LastSeenAt is raised (never
	// lowered) and a host whose status is stale or unknown becomes healthy.
	// It returns the ids whose status changed. For each of them, revived
	// (when not nil) gives the audit record of the transition, appended in
	// the same transaction (none when its Action is empty); it runs inside
	// that transaction and must not call the store.
	TouchHosts(ctx context.Context, seen []Seen, revived func(id string) AuditEvent) ([]string, error)
	// MarkStale sets status stale on heartbeating hosts (healthy,
	// task_result_failed, api_unreachable) last seen before cutoff and returns
	// their ids. A revoked host, and an api_unreachable host whose status
	// reason starts with PreflightStatusReasonPrefix (a preflight run named
	// why it is not heartbeating), are left alone. For each host about to
	// turn stale, mark (when not nil) says what else to write with it, in
	// the same transaction (see StaleMark); it runs inside that transaction
	// and must not call the store. Publishes EventHost for each host marked.
	// A sweep of many hosts may take several transactions: on an error the
	// hosts already marked are returned with it.
	MarkStale(ctx context.Context, cutoff time.Time, mark func(id string, lastSeen time.Time) StaleMark) ([]string, error)
	// UpdateHostHealth reads a host's health and last failure with its row
	// locked, applies fn, and writes back only those two (and UpdatedAt),
	// with the audit records fn returns, in one transaction: a health
	// probe's result, which need not rewrite the rest of the row. fn must
	// not call the store; if it returns an error nothing is written and
	// that error is returned. ErrNotFound for an unknown id. Publishes
	// EventHost.
	UpdateHostHealth(ctx context.Context, id string, fn func(*HealthState) ([]AuditEvent, error)) error
	// ClaimHealthProbe claims the health probe scheduling slot starting at
	// slot for host id: it records slot as the host's last claimed slot
	// when the one recorded is earlier, and reports whether it did. Of
	// several replicas claiming the same slot exactly one gets true. An
	// unknown id is false. No event is published.
	ClaimHealthProbe(ctx context.Context, id string, slot time.Time) (bool, error)
}
