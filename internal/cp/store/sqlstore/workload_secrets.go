package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/drover-dev/drover/internal/cp/store"
)

const workloadSecretMeta = `name, version, created_by, created_at, updated_by, updated_at`

func scanWorkloadSecret(r Row, value *string) (store.WorkloadSecret, error) {
	var (
		ws          store.WorkloadSecret
		created, up int64
	)
	dest := []any{&ws.Name, &ws.Version, &ws.CreatedBy, &created, &ws.UpdatedBy, &up}
	if value != nil {
		dest = append(dest, value)
	}
	if err := r.Scan(dest...); err != nil {
		return store.WorkloadSecret{}, err
	}
	ws.CreatedAt, ws.UpdatedAt = tm(created), tm(up)
	return ws, nil
}

// PutWorkloadSecret implements store.Store with one upsert, so that
// concurrent writers each bump the version once, and the record read back
// and audited in its transaction.
func (s *Store) PutWorkloadSecret(ctx context.Context, ws store.WorkloadSecret,
	audit func(store.WorkloadSecret) []store.AuditEvent) (store.WorkloadSecret, error) {
	if ws.Name == "" {
		return store.WorkloadSecret{}, errors.New("put workload secret: empty name")
	}
	if len(ws.Value) == 0 {
		return store.WorkloadSecret{}, fmt.Errorf("put workload secret %q: empty sealed value", ws.Name)
	}
	at := ws.UpdatedAt
	if at.IsZero() {
		at = s.now()
	}
	var out store.WorkloadSecret
	err := s.db.InTx(ctx, func(tx DB) error {
		if _, err := tx.Exec(ctx, `INSERT INTO workload_secrets
			(name, value, version, created_by, created_at, updated_by, updated_at)
			VALUES ($1, $2, 1, $3, $4, $3, $4)
			ON CONFLICT (name) DO UPDATE SET value = excluded.value,
				version = workload_secrets.version + 1,
				updated_by = excluded.updated_by, updated_at = excluded.updated_at`,
			ws.Name, b64(ws.Value), ws.UpdatedBy, ms(at)); err != nil {
			return fmt.Errorf("put workload secret %q: %w", ws.Name, err)
		}
		var err error
		if out, err = s.getWorkloadSecret(ctx, tx, ws.Name); err != nil {
			return fmt.Errorf("put workload secret %q: read back: %w", ws.Name, err)
		}
		if audit != nil {
			if err := s.appendAuditsTx(ctx, tx, audit(out)); err != nil {
				return fmt.Errorf("put workload secret %q: audit: %w", ws.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return store.WorkloadSecret{}, err
	}
	return out, nil
}

// GetWorkloadSecret implements store.Store.
func (s *Store) GetWorkloadSecret(ctx context.Context, name string) (store.WorkloadSecret, error) {
	return s.getWorkloadSecret(ctx, s.db, name)
}

// getWorkloadSecret reads a secret through db (the store, or a
// transaction).
func (s *Store) getWorkloadSecret(ctx context.Context, db DB, name string) (store.WorkloadSecret, error) {
	var v string
	ws, err := scanWorkloadSecret(db.QueryRow(ctx, `SELECT `+workloadSecretMeta+`, value
		FROM workload_secrets WHERE name = $1`, name), &v)
	if err != nil {
		return store.WorkloadSecret{}, notFound(err, "get workload secret %q", name)
	}
	if ws.Value, err = unb64(v); err != nil {
		return store.WorkloadSecret{}, fmt.Errorf("get workload secret %q: %w", name, err)
	}
	return ws, nil
}

// ListWorkloadSecrets implements store.Store; it never reads a value.
func (s *Store) ListWorkloadSecrets(ctx context.Context) ([]store.WorkloadSecret, error) {
	rows, err := s.db.Query(ctx, `SELECT `+workloadSecretMeta+` FROM workload_secrets ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list workload secrets: %w", err)
	}
	defer rows.Close()
	var out []store.WorkloadSecret
	for rows.Next() {
		ws, err := scanWorkloadSecret(rows, nil)
		if err != nil {
			return nil, fmt.Errorf("list workload secrets: %w", err)
		}
		out = append(out, ws)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list workload secrets: %w", err)
	}
	return out, nil
}

// DeleteWorkloadSecret implements store.Store.
func (s *Store) DeleteWorkloadSecret(ctx context.Context, name string, audit ...store.AuditEvent) error {
	return s.db.InTx(ctx, func(tx DB) error {
		n, err := tx.Exec(ctx, `DELETE FROM workload_secrets WHERE name = $1`, name)
		if err != nil {
			return fmt.Errorf("delete workload secret %q: %w", name, err)
		}
		if n == 0 {
			return fmt.Errorf("delete workload secret %q: %w", name, store.ErrNotFound)
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("delete workload secret %q: audit: %w", name, err)
		}
		return nil
	})
}
