package store

import (
	"context"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

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

// OperatorTokenStore is the operator API credentials: the operator token
// routes (create, list, revoke) and the CLI's first-token bootstrap use it
// whole; operator authentication (cp/httpapi.TokenStore) only looks tokens
// up by hash, and the termgw room by id.
type OperatorTokenStore interface {
	// CreateOperatorToken inserts a token with the audit records that
	// describe it, in one transaction; ErrConflict on duplicate id, hash or
	// name (and nothing is stored).
	CreateOperatorToken(ctx context.Context, t OperatorToken, audit ...AuditEvent) error
	// GetOperatorTokenByHash returns a token or ErrNotFound.
	GetOperatorTokenByHash(ctx context.Context, hash string) (OperatorToken, error)
	// GetOperatorToken returns a token by id or ErrNotFound.
	GetOperatorToken(ctx context.Context, id string) (OperatorToken, error)
	// ListOperatorTokens returns all tokens, oldest first.
	ListOperatorTokens(ctx context.Context) ([]OperatorToken, error)
	// RevokeOperatorToken marks a token revoked, with the audit records,
	// in one transaction; ErrNotFound if absent. Publishes
	// EventOperatorToken.
	RevokeOperatorToken(ctx context.Context, id string, audit ...AuditEvent) error
}
