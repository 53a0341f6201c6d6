package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// UpdateHostHealth implements store.Store: a read of the four health and
// four failure columns and a write of them, instead of UpdateHost's read,
// write and read back of the whole row with its capabilities.
func (s *Store) UpdateHostHealth(ctx context.Context, id string, fn func(*store.HealthState) ([]store.AuditEvent, error)) error {
	return s.db.InTx(ctx, func(tx DB) error {
		var (
			st                 store.HealthState
			health             string
			healthAt, failedAt int64
		)
		err := tx.QueryRow(ctx, `SELECT health, health_summary, health_checked_at, health_task_id, last_failure_signal,
			last_failure_detail, last_failure_correlation_id, last_failure_at FROM hosts WHERE id = $1`+s.d.ForUpdate, id).Scan(
			&health, &st.Health.Summary, &healthAt, &st.Health.TaskID, &st.LastFailure.Signal,
			&st.LastFailure.Detail, &st.LastFailure.CorrelationID, &failedAt)
		if err != nil {
			return notFound(err, "update host %q health", id)
		}
		st.Health.State, st.Health.CheckedAt, st.LastFailure.At = api.HostHealth(health), tm(healthAt), tm(failedAt)
		audits, err := fn(&st)
		if err != nil {
			return err
		}
		h, f := st.Health, st.LastFailure
		if _, err := tx.Exec(ctx, `UPDATE hosts SET health = $2, health_summary = $3, health_checked_at = $4,
			health_task_id = $5, last_failure_signal = $6, last_failure_detail = $7, last_failure_correlation_id = $8,
			last_failure_at = $9, updated_at = $10 WHERE id = $1`, id, string(h.State), h.Summary, ms(h.CheckedAt),
			h.TaskID, f.Signal, f.Detail, f.CorrelationID, ms(f.At), ms(s.now())); err != nil {
			return fmt.Errorf("update host %q health: %w", id, err)
		}
		if err := s.appendAuditsTx(ctx, tx, audits); err != nil {
			return fmt.Errorf("update host %q health: audit: %w", id, err)
		}
		if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventHost, ID: id}); err != nil {
			return fmt.Errorf("update host %q health: notify: %w", id, err)
		}
		return nil
	})
}

// ClaimHealthProbe implements store.Store: one conditional update, so of
// replicas racing for the same slot exactly one sees a row changed.
func (s *Store) ClaimHealthProbe(ctx context.Context, id string, slot time.Time) (bool, error) {
	n, err := s.db.Exec(ctx, `UPDATE hosts SET health_probe_at = $2 WHERE id = $1 AND health_probe_at < $2`, id, ms(slot))
	if err != nil {
		return false, fmt.Errorf("claim health probe %q: %w", id, err)
	}
	return n == 1, nil
}
