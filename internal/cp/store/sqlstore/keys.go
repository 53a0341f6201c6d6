package sqlstore

import (
	"context"
	"fmt"

	"github.com/drover-dev/drover/internal/cp/store"
)

// ReplaceSecret implements store.Store with a conditional UPDATE, so that
// replicas encrypting the same row at once do not overwrite each other.
func (s *Store) ReplaceSecret(ctx context.Context, name string, old, value []byte) error {
	return s.replace(ctx, "secret", `UPDATE secrets SET value = $3 WHERE name = $1 AND value = $2`,
		`SELECT COUNT(*) FROM secrets WHERE name = $1`, name, old, value)
}

// ReplaceSigningKey implements store.Store like ReplaceSecret.
func (s *Store) ReplaceSigningKey(ctx context.Context, kid string, old, priv []byte) error {
	return s.replace(ctx, "signing key", `UPDATE signing_keys SET private_key = $3 WHERE kid = $1 AND private_key = $2`,
		`SELECT COUNT(*) FROM signing_keys WHERE kid = $1`, kid, old, priv)
}

// ReplaceWorkloadSecret implements store.Store like ReplaceSecret.
func (s *Store) ReplaceWorkloadSecret(ctx context.Context, name string, old, value []byte) error {
	return s.replace(ctx, "workload secret", `UPDATE workload_secrets SET value = $3 WHERE name = $1 AND value = $2`,
		`SELECT COUNT(*) FROM workload_secrets WHERE name = $1`, name, old, value)
}

func (s *Store) replace(ctx context.Context, what, update, count, id string, old, value []byte) error {
	n, err := s.db.Exec(ctx, update, id, b64(old), b64(value))
	if err != nil {
		return fmt.Errorf("replace %s %q: %w", what, id, err)
	}
	if n == 1 {
		return nil
	}
	var c int64
	if err := s.db.QueryRow(ctx, count, id).Scan(&c); err != nil {
		return fmt.Errorf("replace %s %q: %w", what, id, err)
	}
	if c == 0 {
		return fmt.Errorf("replace %s %q: %w", what, id, store.ErrNotFound)
	}
	return fmt.Errorf("replace %s %q: value changed: %w", what, id, store.ErrConflict)
}

// GetSecret implements store.Store.
func (s *Store) GetSecret(ctx context.Context, name string) ([]byte, error) {
	var v string
	if err := s.db.QueryRow(ctx, `SELECT value FROM secrets WHERE name = $1`, name).Scan(&v); err != nil {
		return nil, notFound(err, "get secret %q", name)
	}
	b, err := unb64(v)
	if err != nil {
		return nil, fmt.Errorf("get secret %q: %w", name, err)
	}
	return b, nil
}
