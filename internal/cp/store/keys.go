package store

import (
	"context"
	"time"
)

// SigningKey is a task-signing key pair. PrivateKey is the PKCS#8 DER of an
// Ed25519 key. Retired keys are kept in the JWKS until RetiredAt + grace.
type SigningKey struct {
	KID        string
	PrivateKey []byte
	CreatedAt  time.Time
	RetiredAt  time.Time // zero while active
}

// KeyStore is the secrets table (the CA) and the task-signing keys: the
// keys room (cp/keys: the CA, the keyring, their sealing at rest with the
// KEK) embeds it whole.
type KeyStore interface {
	// PutSecretIfAbsent stores value under name unless a value exists, and
	// returns the stored value either way (first writer wins across replicas).
	PutSecretIfAbsent(ctx context.Context, name string, value []byte) ([]byte, error)
	// RotateSigningKey inserts k (ErrConflict on a duplicate kid), retires
	// every other active key at k.CreatedAt and appends the audit records,
	// in one transaction: a crash leaves the rotation whole or not at all,
	// and never without its records.
	RotateSigningKey(ctx context.Context, k SigningKey, audit ...AuditEvent) error
	// ListSigningKeys returns all signing keys, oldest first.
	ListSigningKeys(ctx context.Context) ([]SigningKey, error)
	// GetSecret returns a secret's stored value or ErrNotFound.
	GetSecret(ctx context.Context, name string) ([]byte, error)
	// ReplaceSecret sets the secret name to value if it still holds old
	// (encryption at rest in place): ErrNotFound if absent, ErrConflict if
	// its value is no longer old.
	ReplaceSecret(ctx context.Context, name string, old, value []byte) error
	// ReplaceSigningKey sets the private key of kid to priv if it still is
	// old, like ReplaceSecret.
	ReplaceSigningKey(ctx context.Context, kid string, old, priv []byte) error
}
