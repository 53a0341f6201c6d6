package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

// CreateDashboardSession implements store.Store.
func (s *Store) CreateDashboardSession(ctx context.Context, ds store.DashboardSession, keep int) error {
	switch {
	case ds.IDHash == "":
		return errors.New("create dashboard session: empty id hash")
	case len(ds.Token) == 0:
		return errors.New("create dashboard session: empty sealed token")
	}
	if ds.CreatedAt.IsZero() {
		ds.CreatedAt = s.now()
	}
	return s.db.InTx(ctx, func(tx DB) error {
		_, err := tx.Exec(ctx, `INSERT INTO dashboard_sessions (id_hash, token_id, token, csrf, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6)`, ds.IDHash, ds.TokenID, b64(ds.Token), ds.CSRF, ms(ds.CreatedAt), ms(ds.ExpiresAt))
		if err != nil {
			if s.d.IsUniqueViolation(err) {
				return fmt.Errorf("create dashboard session: %w", store.ErrConflict)
			}
			return fmt.Errorf("create dashboard session: %w", err)
		}
		if keep < 1 {
			return nil
		}
		if _, err := tx.Exec(ctx, `DELETE FROM dashboard_sessions WHERE token_id = $1 AND id_hash NOT IN
			(SELECT id_hash FROM dashboard_sessions WHERE token_id = $1 ORDER BY created_at DESC, id_hash DESC LIMIT $2)`,
			ds.TokenID, keep); err != nil {
			return fmt.Errorf("create dashboard session: end the token's oldest: %w", err)
		}
		return nil
	})
}

const sessionCols = `id_hash, token_id, token, csrf, created_at, expires_at`

func scanSession(r Row) (store.DashboardSession, error) {
	var (
		ds               store.DashboardSession
		token            string
		created, expires int64
	)
	if err := r.Scan(&ds.IDHash, &ds.TokenID, &token, &ds.CSRF, &created, &expires); err != nil {
		return store.DashboardSession{}, err
	}
	var err error
	if ds.Token, err = unb64(token); err != nil {
		return store.DashboardSession{}, fmt.Errorf("token: %w", err)
	}
	ds.CreatedAt, ds.ExpiresAt = tm(created), tm(expires)
	return ds, nil
}

// GetDashboardSession implements store.Store.
func (s *Store) GetDashboardSession(ctx context.Context, idHash string) (store.DashboardSession, error) {
	ds, err := scanSession(s.db.QueryRow(ctx, `SELECT `+sessionCols+` FROM dashboard_sessions WHERE id_hash = $1`, idHash))
	if err != nil {
		return store.DashboardSession{}, notFound(err, "get dashboard session")
	}
	return ds, nil
}

// ListDashboardSessions implements store.Store.
func (s *Store) ListDashboardSessions(ctx context.Context) ([]store.DashboardSession, error) {
	rows, err := s.db.Query(ctx, `SELECT `+sessionCols+` FROM dashboard_sessions ORDER BY created_at, id_hash`)
	if err != nil {
		return nil, fmt.Errorf("list dashboard sessions: %w", err)
	}
	defer rows.Close()
	var out []store.DashboardSession
	for rows.Next() {
		ds, err := scanSession(rows)
		if err != nil {
			return nil, fmt.Errorf("list dashboard sessions: %w", err)
		}
		out = append(out, ds)
	}
	return out, rows.Err()
}

// ReplaceDashboardSessionToken implements store.Store like ReplaceSecret.
func (s *Store) ReplaceDashboardSessionToken(ctx context.Context, idHash string, old, token []byte) error {
	return s.replace(ctx, "dashboard session", `UPDATE dashboard_sessions SET token = $3 WHERE id_hash = $1 AND token = $2`,
		`SELECT COUNT(*) FROM dashboard_sessions WHERE id_hash = $1`, idHash, old, token)
}

// DeleteDashboardSession implements store.Store.
func (s *Store) DeleteDashboardSession(ctx context.Context, idHash string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM dashboard_sessions WHERE id_hash = $1`, idHash); err != nil {
		return fmt.Errorf("delete dashboard session: %w", err)
	}
	return nil
}

// DeleteExpiredDashboardSessions implements store.Store.
func (s *Store) DeleteExpiredDashboardSessions(ctx context.Context, now time.Time) (int, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM dashboard_sessions WHERE expires_at <= $1`, ms(now))
	if err != nil {
		return 0, fmt.Errorf("delete expired dashboard sessions: %w", err)
	}
	return int(n), nil
}
