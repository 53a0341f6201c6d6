package store

import (
	"context"
	"time"
)

// DashboardSession is one logged-in browser of the operator dashboard.
// Token is the operator token the session acts with, sealed with the
// key-encryption key: the store never sees it in plaintext, nor the
// session cookie (IDHash is its SHA-256).
type DashboardSession struct {
	IDHash    string
	TokenID   string // the operator token's id (not secret)
	Token     []byte // sealed
	CSRF      string
	CreatedAt time.Time
	ExpiresAt time.Time
}

// DashboardSessionStore is the dashboard's sessions, shared by the
// replicas: the dashboard (cp/dashboard) embeds it whole.
type DashboardSessionStore interface {
	// CreateDashboardSession stores a new session; ErrConflict if its
	// IDHash exists. In the same transaction it removes the oldest
	// sessions of s.TokenID beyond the newest keep (keep < 1: none).
	CreateDashboardSession(ctx context.Context, s DashboardSession, keep int) error
	// GetDashboardSession returns a session, or ErrNotFound. It does not
	// look at ExpiresAt.
	GetDashboardSession(ctx context.Context, idHash string) (DashboardSession, error)
	// DeleteDashboardSession removes a session (a logout); removing one
	// that is not there is not an error.
	DeleteDashboardSession(ctx context.Context, idHash string) error
	// DeleteExpiredDashboardSessions removes the sessions whose ExpiresAt
	// is not after now, and returns how many.
	DeleteExpiredDashboardSessions(ctx context.Context, now time.Time) (int, error)
	// ListDashboardSessions returns every session, its token sealed, oldest
	// first (at most 32 per operator token: CreateDashboardSession's keep).
	ListDashboardSessions(ctx context.Context) ([]DashboardSession, error)
	// ReplaceDashboardSessionToken sets a session's sealed token to token
	// if it still is old (sealing it again with a new key-encryption key):
	// ErrNotFound if the session is gone, ErrConflict if its token changed.
	ReplaceDashboardSessionToken(ctx context.Context, idHash string, old, token []byte) error
}
