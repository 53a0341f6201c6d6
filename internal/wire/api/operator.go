package api

import (
	"encoding/json"
	"time"
)

// CreateHostRequest is POST /api/v1/hosts.
type CreateHostRequest struct {
	HostID   string            `json:"host_id"`
	OSFamily string            `json:"os_family"`
	Labels   map[string]string `json:"labels,omitempty"`
	// TokenTTL is how long the bootstrap token stays valid (default 24h).
	TokenTTL Duration `json:"token_ttl,omitempty"`
	// APIURL and TerminalURL are the host's environment profile (see
	// HostProfile); optional.
	APIURL      string `json:"api_url,omitempty"`
	TerminalURL string `json:"terminal_url,omitempty"`
}

// BootstrapToken is returned once, on host creation or token rotation.
type BootstrapToken struct {
	HostID    string    `json:"host_id"`
	Token     string    `json:"bootstrap_token"`
	ExpiresAt time.Time `json:"expires_at"`
	// CAHash pins the control plane's CA for first contact ("sha256:<hex>").
	CAHash  string `json:"ca_hash"`
	NodeURL string `json:"node_url,omitempty"`
}

// Host is a host record as the operator API shows it.
type Host struct {
	ID             string            `json:"host_id"`
	OSFamily       string            `json:"os_family"`
	Labels         map[string]string `json:"labels,omitempty"`
	Enabled        bool              `json:"enabled"`
	Revoked        bool              `json:"revoked"`
	Status         HostStatus        `json:"status"`
	StatusReason   string            `json:"status_reason,omitempty"`
	Schedulable    bool              `json:"schedulable"`
	Draining       bool              `json:"draining"` // takes no new instances
	Hostname       string            `json:"hostname,omitempty"`
	SelectedAccel  string            `json:"selected_accel,omitempty"`
	Capabilities   *Capabilities     `json:"capabilities,omitempty"`
	Capacity       *CapacityReport   `json:"capacity,omitempty"`
	AgentVersion   string            `json:"agent_version,omitempty"`
	Enrolled       bool              `json:"enrolled"`
	TokenExpiresAt *time.Time        `json:"token_expires_at,omitempty"`
	CertNotAfter   *time.Time        `json:"cert_not_after,omitempty"`
	LastSeenAt     *time.Time        `json:"last_seen_at,omitempty"`
	// HeartbeatInterval is the control plane's heartbeat interval: a host
	// is stale after 3 of them without a heartbeat.
	HeartbeatInterval Duration  `json:"heartbeat_interval,omitempty"`
	CreatedAt         time.Time `json:"created_at"`
	UpdatedAt         time.Time `json:"updated_at"`
	// The last failure seen for the host: an internal/wire/signal name, its
	// detail, the correlation id to find its evidence by, and when.
	LastFailureSignal        string     `json:"last_failure_signal,omitempty"`
	LastFailureDetail        string     `json:"last_failure_detail,omitempty"`
	LastFailureCorrelationID string     `json:"last_failure_correlation_id,omitempty"`
	LastFailureAt            *time.Time `json:"last_failure_at,omitempty"`
	// LastSuccessfulPreflightAt is when a stored preflight run for the host
	// last passed.
	LastSuccessfulPreflightAt *time.Time `json:"last_successful_preflight_at,omitempty"`
	// Profile is the environment the host's agent should use, and what it
	// reports it uses.
	Profile HostProfile `json:"profile"`
	// Health is what the last finished diag.health_probe said (scheduled
	// every health probe interval, or run by an operator): healthy,
	// unhealthy or unknown, its summary (the failed checks), when it
	// finished and the task; absent before the first probe.
	Health          HostHealth `json:"health,omitempty"`
	HealthSummary   string     `json:"health_summary,omitempty"`
	HealthCheckedAt *time.Time `json:"health_checked_at,omitempty"`
	HealthTaskID    string     `json:"health_task_id,omitempty"`
}

// EnqueueTaskRequest is POST /api/v1/tasks. Either TTL or ExpiresAt may be
// set; the default TTL is 10 minutes.
type EnqueueTaskRequest struct {
	NodeID        string          `json:"node_id"`
	Type          string          `json:"type"`
	Params        json.RawMessage `json:"params,omitempty"`
	TTL           Duration        `json:"ttl,omitempty"`
	ExpiresAt     *time.Time      `json:"expires_at,omitempty"`
	CorrelationID string          `json:"correlation_id,omitempty"`
}

// Task is a task as the operator API shows it.
type Task struct {
	ID            string          `json:"task_id"`
	NodeID        string          `json:"node_id"`
	Type          string          `json:"type"`
	Params        json.RawMessage `json:"params"`
	State         TaskState       `json:"state"`
	CorrelationID string          `json:"correlation_id"`
	Attempts      int             `json:"attempts"`
	CreatedAt     time.Time       `json:"created_at"`
	ExpiresAt     time.Time       `json:"expires_at"`
	DispatchedAt  *time.Time      `json:"dispatched_at,omitempty"`
	FinishedAt    *time.Time      `json:"finished_at,omitempty"`
	Result        *TaskResult     `json:"result,omitempty"`
	Events        []TaskEvent     `json:"events,omitempty"`
	CreatedBy     string          `json:"created_by,omitempty"`
	// Envelope is set by GET /api/v1/tasks/{id} and in evidence bundles.
	Envelope *TaskEnvelope `json:"envelope,omitempty"`
}

// TaskEnvelope is what a task's signed envelope carries (envelopes are not
// stored): KID is the key signing now, IssuedAt the dispatch time (unset
// before), Expires the task's expiry and Audience its node (Unix seconds).
type TaskEnvelope struct {
	KID      string `json:"kid"`
	IssuedAt int64  `json:"iat,omitempty"`
	Expires  int64  `json:"exp"`
	Audience string `json:"aud"`
}

// CreateOperatorTokenRequest is POST /api/v1/tokens.
// Role defaults to operator; it may not be above the caller's own role. At
// most one of TTL and ExpiresAt; neither means the token does not expire.
type CreateOperatorTokenRequest struct {
	Name      string     `json:"name"`
	Role      Role       `json:"role,omitempty"`
	TTL       Duration   `json:"ttl,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// OperatorToken describes an operator token; Token is set only on creation.
type OperatorToken struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Role      Role       `json:"role"`
	Token     string     `json:"token,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Revoked   bool       `json:"revoked"`
}

// AuditEvent is one audit record. ActorTokenID and ActorRole are set when
// the actor is an operator token ("operator:<name>").
type AuditEvent struct {
	ID            int64     `json:"id"`
	At            time.Time `json:"at"`
	Actor         string    `json:"actor"`
	ActorTokenID  string    `json:"actor_token_id,omitempty"`
	ActorRole     Role      `json:"actor_role,omitempty"`
	Action        string    `json:"action"`
	Target        string    `json:"target"`
	Result        string    `json:"result"`
	CorrelationID string    `json:"correlation_id,omitempty"`
	Detail        string    `json:"detail,omitempty"`
}

// ApproveSlotsRequest is POST /api/v1/hosts/{id}/slots: approve candidate
// slots from a succeeded slice.topology_discover task.
type ApproveSlotsRequest struct {
	TaskID      string `json:"task_id"`
	SlotIndexes []int  `json:"slot_indexes,omitempty"`
	All         bool   `json:"all,omitempty"`
}

// Slot is an approved node resource slot.
type Slot struct {
	HostID     string          `json:"host_id"`
	SlotID     string          `json:"slot_id"`
	Index      int             `json:"slot_index"`
	Spec       json.RawMessage `json:"spec"`
	SourceTask string          `json:"source_task"`
	ApprovedBy string          `json:"approved_by"`
	ApprovedAt time.Time       `json:"approved_at"`
}

// PlacementRequest is POST /api/v1/placements/check: which schedulable
// host has room for these resources (on NodeID only, when set)?
type PlacementRequest struct {
	NodeID    string            `json:"node_id,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Resources Capacity          `json:"resources"`
}

// PlacementResponse names the chosen host and its free capacity.
type PlacementResponse struct {
	NodeID string   `json:"node_id"`
	Free   Capacity `json:"free"`
}
