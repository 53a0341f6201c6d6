package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/drover-dev/drover/internal/cp/store"
)

// ApproveSlots implements store.Store: all slots and their records are
// inserted in one transaction, or none if one already exists.
func (s *Store) ApproveSlots(ctx context.Context, slots []store.Slot, audit ...store.AuditEvent) error {
	if len(slots) == 0 {
		return errors.New("approve slots: none given")
	}
	return s.db.InTx(ctx, func(tx DB) error {
		for _, sl := range slots {
			at := sl.ApprovedAt
			if at.IsZero() {
				at = s.now()
			}
			_, err := tx.Exec(ctx, `INSERT INTO host_slots (host_id, slot_id, slot_index, spec, source_task, approved_by, approved_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7)`,
				sl.HostID, sl.SlotID, sl.Index, rawText(sl.Spec), sl.SourceTask, sl.ApprovedBy, ms(at))
			if err != nil {
				if s.d.IsUniqueViolation(err) {
					return fmt.Errorf("approve slot %s/%s: %w", sl.HostID, sl.SlotID, store.ErrConflict)
				}
				return fmt.Errorf("approve slot %s/%s: %w", sl.HostID, sl.SlotID, err)
			}
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("approve slots: audit: %w", err)
		}
		return nil
	})
}

// ListSlots implements store.Store.
func (s *Store) ListSlots(ctx context.Context, hostID string) ([]store.Slot, error) {
	rows, err := s.db.Query(ctx, `SELECT host_id, slot_id, slot_index, spec, source_task, approved_by, approved_at
		FROM host_slots WHERE host_id = $1 ORDER BY slot_index, slot_id`, hostID)
	if err != nil {
		return nil, fmt.Errorf("list slots of %q: %w", hostID, err)
	}
	defer rows.Close()
	var out []store.Slot
	for rows.Next() {
		var (
			sl   store.Slot
			spec string
			at   int64
		)
		if err := rows.Scan(&sl.HostID, &sl.SlotID, &sl.Index, &spec, &sl.SourceTask, &sl.ApprovedBy, &at); err != nil {
			return nil, fmt.Errorf("list slots of %q: %w", hostID, err)
		}
		sl.Spec, sl.ApprovedAt = textRaw(spec), tm(at)
		out = append(out, sl)
	}
	return out, rows.Err()
}

// DeleteSlot implements store.Store.
func (s *Store) DeleteSlot(ctx context.Context, hostID, slotID string, audit ...store.AuditEvent) error {
	return s.db.InTx(ctx, func(tx DB) error {
		n, err := tx.Exec(ctx, `DELETE FROM host_slots WHERE host_id = $1 AND slot_id = $2`, hostID, slotID)
		if err != nil {
			return fmt.Errorf("delete slot %s/%s: %w", hostID, slotID, err)
		}
		if n == 0 {
			return fmt.Errorf("delete slot %s/%s: %w", hostID, slotID, store.ErrNotFound)
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("delete slot %s/%s: audit: %w", hostID, slotID, err)
		}
		return nil
	})
}
