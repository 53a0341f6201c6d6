package sqlstore

import (
	"context"
	"fmt"
	"slices"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

const instanceEventCols = `instance_id, seq, at, phase, reason_code, message, desired_state, generation,
	observed_generation, actor, correlation_id`

func scanInstanceEvent(r Row) (store.InstanceEvent, error) {
	var (
		ev                     store.InstanceEvent
		phase, reason, desired string
		at                     int64
	)
	if err := r.Scan(&ev.InstanceID, &ev.Seq, &at, &phase, &reason, &ev.Message, &desired, &ev.Generation,
		&ev.ObservedGeneration, &ev.Actor, &ev.CorrelationID); err != nil {
		return store.InstanceEvent{}, err
	}
	ev.At, ev.Phase, ev.ReasonCode, ev.DesiredState = tm(at), api.InstancePhase(phase), api.ReasonCode(reason), api.DesiredState(desired)
	return ev, nil
}

// AppendInstanceEvent implements store.Store. It locks the instance's row,
// so appends to one instance are numbered one at a time, and the events'
// seqs are contiguous: those at or below seq - MaxInstanceEvents go.
func (s *Store) AppendInstanceEvent(ctx context.Context, ev store.InstanceEvent) error {
	return s.db.InTx(ctx, func(tx DB) error {
		var id string
		if err := tx.QueryRow(ctx, `SELECT id FROM instances WHERE id = $1`+s.d.ForUpdate, ev.InstanceID).Scan(&id); err != nil {
			return notFound(err, "append instance event %q", ev.InstanceID)
		}
		return s.appendInstanceEventTx(ctx, tx, ev)
	})
}

// appendInstanceEventTx numbers and inserts ev in tx, which holds the
// instance's row lock, and prunes the events beyond MaxInstanceEvents.
func (s *Store) appendInstanceEventTx(ctx context.Context, tx DB, ev store.InstanceEvent) error {
	if ev.At.IsZero() {
		ev.At = s.now()
	}
	var last int64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM instance_events WHERE instance_id = $1`,
		ev.InstanceID).Scan(&last); err != nil {
		return fmt.Errorf("append instance event %q: %w", ev.InstanceID, err)
	}
	seq := last + 1
	if _, err := tx.Exec(ctx, `INSERT INTO instance_events (`+instanceEventCols+`) VALUES
		($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		ev.InstanceID, seq, ms(ev.At), string(ev.Phase), string(ev.ReasonCode), ev.Message, string(ev.DesiredState),
		ev.Generation, ev.ObservedGeneration, ev.Actor, ev.CorrelationID); err != nil {
		return fmt.Errorf("append instance event %q: %w", ev.InstanceID, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM instance_events WHERE instance_id = $1 AND seq <= $2`,
		ev.InstanceID, seq-store.MaxInstanceEvents); err != nil {
		return fmt.Errorf("append instance event %q: prune: %w", ev.InstanceID, err)
	}
	return nil
}

// ListInstanceEvents implements store.Store.
func (s *Store) ListInstanceEvents(ctx context.Context, instanceID string, limit int) ([]store.InstanceEvent, error) {
	if limit <= 0 || limit > store.MaxInstanceEvents {
		limit = store.MaxInstanceEvents
	}
	out, err := collect(scanInstanceEvent)(s.db.Query(ctx, `SELECT `+instanceEventCols+` FROM instance_events
		WHERE instance_id = $1 ORDER BY seq DESC LIMIT $2`, instanceID, limit))
	if err != nil {
		return nil, fmt.Errorf("list instance events %q: %w", instanceID, err)
	}
	slices.Reverse(out)
	return out, nil
}
