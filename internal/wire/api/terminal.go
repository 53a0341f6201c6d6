package api

import "time"

// AllocationState is the lifecycle of an allocation.
type AllocationState string

// Allocation states. A host allocation is provisioning until its
// allocation.provision_user task succeeds; an instance allocation is active
// at once (its terminal is the instance's serial console).
const (
	AllocationProvisioning AllocationState = "provisioning"
	AllocationActive       AllocationState = "active"
	AllocationFailed       AllocationState = "failed"
	AllocationReleasing    AllocationState = "releasing"
	AllocationReleased     AllocationState = "released"
)

// AllocationKind says what an allocation binds its user to.
type AllocationKind string

// Allocation kinds.
const (
	// AllocationHost: an OS user on a whole host (bare metal); terminals are
	// PTYs running as that user.
	AllocationHost AllocationKind = "host"
	// AllocationInstance: a VM instance; terminals attach to its serial
	// console.
	AllocationInstance AllocationKind = "instance"
	// AllocationSlice: a slice VM with N approved slots passed through,
	// provisioned by the control plane's workflow (internal/cp/sliceflow).
	AllocationSlice AllocationKind = "slice"
)

// CreateAllocationRequest is POST /api/v1/allocations. Exactly one of
// HostID and InstanceID is set, except for a slice allocation (Slots > 0),
// where HostID is optional (placement picks a host) and the Slice fields
// apply.
type CreateAllocationRequest struct {
	// Username is the OS user (host allocations) or the person the console
	// is for (instance allocations): a Linux user name, not root.
	Username          string   `json:"username"`
	HostID            string   `json:"host_id,omitempty"`
	InstanceID        string   `json:"instance_id,omitempty"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
	Shell             string   `json:"shell,omitempty"`
	Sudo              bool     `json:"sudo,omitempty"`
	SliceRequest
}

// Allocation is an allocation as the operator API shows it.
type Allocation struct {
	ID         string          `json:"id"`
	Kind       AllocationKind  `json:"kind"`
	Username   string          `json:"username"`
	HostID     string          `json:"host_id"`
	InstanceID string          `json:"instance_id,omitempty"`
	State      AllocationState `json:"state"`
	// StateReason says why the allocation failed (the task's error code and
	// message).
	StateReason     string    `json:"state_reason,omitempty"`
	ProvisionTaskID string    `json:"provision_task_id,omitempty"`
	ReleaseTaskID   string    `json:"release_task_id,omitempty"`
	CreatedBy       string    `json:"created_by,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
	// Workflow is a slice allocation's provisioning workflow.
	Workflow *SliceWorkflow `json:"workflow,omitempty"`
}

// TerminalTokenRequest is the optional body of
// POST /api/v1/allocations/{id}/terminal-token: the browser's initial
// terminal size (default 80x24), sent to the node with terminal.open so the
// PTY starts at the right size.
type TerminalTokenRequest struct {
	Cols int `json:"cols,omitempty"`
	Rows int `json:"rows,omitempty"`
}

// TerminalToken is a minted terminal token. Token is shown once; it is
// single use and expires at ExpiresAt (at most 60 s after minting). The
// browser offers it as the WebSocket subprotocol "drover.token.<token>"
// next to "drover.terminal.v1" when it opens URL.
type TerminalToken struct {
	Token        string    `json:"token"`
	SessionID    string    `json:"session_id"`
	AllocationID string    `json:"allocation_id"`
	NodeID       string    `json:"node_id"`
	ExpiresAt    time.Time `json:"expires_at"`
	// URL is the gateway path to open, relative to the operator API
	// ("/api/v1/terminal?allocation_id=...").
	URL         string `json:"url"`
	Subprotocol string `json:"subprotocol"`
}

// TerminalStateEvent is one readiness hop a session reached.
type TerminalStateEvent struct {
	State string    `json:"state"`
	At    time.Time `json:"at"`
	// ElapsedMS is the time since the token was minted.
	ElapsedMS int64  `json:"elapsed_ms"`
	Detail    string `json:"detail,omitempty"`
}

// TerminalSession is a terminal session as the operator API shows it.
type TerminalSession struct {
	ID           string `json:"id"`
	AllocationID string `json:"allocation_id"`
	NodeID       string `json:"node_id"`
	Username     string `json:"username"`
	// Mode is "pty" (host allocation) or "serial" (instance console).
	Mode       string `json:"mode"`
	InstanceID string `json:"instance_id,omitempty"`
	// State is the last readiness state reached (a terminal.State).
	State        string               `json:"state"`
	States       []TerminalStateEvent `json:"states"`
	ErrorCode    string               `json:"error_code,omitempty"`
	ErrorMessage string               `json:"error_message,omitempty"`
	// Signal is the outage signal (internal/wire/signal) of a session that
	// failed for a reason an operator must act on, e.g.
	// terminal_node_stream_timeout for error code node_stream_timeout.
	Signal        string     `json:"signal,omitempty"`
	TaskID        string     `json:"task_id,omitempty"`
	CorrelationID string     `json:"correlation_id"`
	Cols          int        `json:"cols"`
	Rows          int        `json:"rows"`
	CreatedBy     string     `json:"created_by,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	ClosedAt      *time.Time `json:"closed_at,omitempty"`
	ExitCode      *int       `json:"exit_code,omitempty"`
	// CloseReason is why the session ended: "exit", "browser_closed",
	// "node_closed", "token_expired" (the token was never redeemed), or an
	// error code.
	CloseReason    string `json:"close_reason,omitempty"`
	RecordingBytes int64  `json:"recording_bytes"`
	// RecordingURL is the asciicast v2 recording, once the session started.
	RecordingURL string `json:"recording_url,omitempty"`
}
