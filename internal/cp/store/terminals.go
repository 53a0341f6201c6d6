package store

import (
	"context"
	"encoding/json"
	"time"
)

// TerminalSession is one browser terminal session, created when its token
// is minted. Only the token's SHA-256 is stored. States is the JSON array of
// api.TerminalStateEvent the gateway appends to as the session passes the
// readiness hops (terminal.State); State is the last of them.
type TerminalSession struct {
	ID             string
	AllocationID   string
	NodeID         string
	Username       string
	Mode           string // "pty", "serial" or "vm_ssh" (a slice VM)
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
	AllocationID  string
	NodeID        string
	CorrelationID string
	TaskID        string
	Limit         int // default 100
}

// TerminalStore is the browser terminal sessions and their single-use
// tokens: the termgw room (cp/termgw: token mint, redemption, the session's
// readiness hops and recording, revocation) embeds it whole.
type TerminalStore interface {
	// CreateTerminalSession inserts a session, with audit in its
	// transaction; ErrConflict if the id or the token hash exists.
	CreateTerminalSession(ctx context.Context, s TerminalSession, audit ...AuditEvent) error
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
}
