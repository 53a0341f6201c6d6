package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

var _ store.TerminalLeaseStore = (*Store)(nil)

// RenewTerminalLease implements store.TerminalLeaseStore with one upsert.
func (s *Store) RenewTerminalLease(ctx context.Context, l store.TerminalLease) error {
	if l.SessionID == "" {
		return fmt.Errorf("renew terminal lease: empty session id")
	}
	if _, err := s.db.Exec(ctx, `INSERT INTO terminal_session_leases (session_id, replica, lease_until) VALUES ($1, $2, $3)
		ON CONFLICT (session_id) DO UPDATE SET replica = excluded.replica, lease_until = excluded.lease_until`,
		l.SessionID, l.Replica, ms(l.LeaseUntil)); err != nil {
		return fmt.Errorf("renew terminal lease of session %q: %w", l.SessionID, err)
	}
	return nil
}

// DeleteTerminalLease implements store.TerminalLeaseStore.
func (s *Store) DeleteTerminalLease(ctx context.Context, sessionID string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM terminal_session_leases WHERE session_id = $1`, sessionID); err != nil {
		return fmt.Errorf("delete terminal lease of session %q: %w", sessionID, err)
	}
	return nil
}

// ExpiredTerminalLeases implements store.TerminalLeaseStore.
func (s *Store) ExpiredTerminalLeases(ctx context.Context, now time.Time, limit int) ([]store.TerminalLease, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.db.Query(ctx, `SELECT session_id, replica, lease_until FROM terminal_session_leases
		WHERE lease_until < $1 ORDER BY lease_until, session_id LIMIT $2`, ms(now), limit)
	if err != nil {
		return nil, fmt.Errorf("list expired terminal leases: %w", err)
	}
	defer rows.Close()
	var out []store.TerminalLease
	for rows.Next() {
		var l store.TerminalLease
		var until int64
		if err := rows.Scan(&l.SessionID, &l.Replica, &until); err != nil {
			return nil, fmt.Errorf("list expired terminal leases: %w", err)
		}
		l.LeaseUntil = tm(until)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list expired terminal leases: %w", err)
	}
	return out, nil
}
