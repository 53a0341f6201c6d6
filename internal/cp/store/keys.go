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
}
