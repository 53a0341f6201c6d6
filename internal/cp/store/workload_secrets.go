package store

import (
	"context"
	"time"
)

// WorkloadSecret is a secret operators set for instances to read (an
// instance spec names it in spec.secrets). Value is the value sealed with
// the key-encryption key: the store never sees the plaintext.
type WorkloadSecret struct {
	Name      string
	Value     []byte // sealed; nil in ListWorkloadSecrets
	Version   int64  // 1 on creation, +1 on every replacement
	CreatedBy string
	CreatedAt time.Time
	UpdatedBy string
	UpdatedAt time.Time
}

// WorkloadSecretStore is the workload secrets table: the secrets room
// (cp/secrets) embeds it whole.
type WorkloadSecretStore interface {
	// PutWorkloadSecret creates the secret s.Name (version 1, created and
	// updated by s.UpdatedBy at s.UpdatedAt; a zero time is now) or
	// replaces its value (version + 1, updated by and at; created by and
	// at kept), and returns the stored record. The records audit (when not
	// nil) returns for the stored record are appended in the same
	// transaction; it must not call the store.
	PutWorkloadSecret(ctx context.Context, s WorkloadSecret, audit func(WorkloadSecret) []AuditEvent) (WorkloadSecret, error)
	// GetWorkloadSecret returns a secret with its sealed value, or
	// ErrNotFound.
	GetWorkloadSecret(ctx context.Context, name string) (WorkloadSecret, error)
	// ListWorkloadSecrets returns every secret's metadata (Value nil), by
	// name.
	ListWorkloadSecrets(ctx context.Context) ([]WorkloadSecret, error)
	// DeleteWorkloadSecret removes a secret, with the audit records, in
	// one transaction; ErrNotFound if absent.
	DeleteWorkloadSecret(ctx context.Context, name string, audit ...AuditEvent) error
	// ReplaceWorkloadSecret swaps a secret's sealed value for value (the
	// same plaintext sealed again: a KEK rotation) if it still is old,
	// keeping its version and times; ErrConflict if it changed meanwhile,
	// ErrNotFound if absent.
	ReplaceWorkloadSecret(ctx context.Context, name string, old, value []byte) error
}
