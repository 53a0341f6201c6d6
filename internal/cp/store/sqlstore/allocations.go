package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

const allocationCols = `id, username, host_id, instance_id, state, state_reason, spec,
	provision_task_id, release_task_id, created_by, created_at, updated_at`

func scanAllocation(r Row) (store.Allocation, error) {
	var (
		a                store.Allocation
		state, spec      string
		created, updated int64
	)
	if err := r.Scan(&a.ID, &a.Username, &a.HostID, &a.InstanceID, &state, &a.StateReason, &spec,
		&a.ProvisionTaskID, &a.ReleaseTaskID, &a.CreatedBy, &created, &updated); err != nil {
		return store.Allocation{}, err
	}
	a.State, a.Spec = api.AllocationState(state), textRaw(spec)
	a.CreatedAt, a.UpdatedAt = tm(created), tm(updated)
	return a, nil
}

// allocationArgs returns a's column values in allocationCols order.
func allocationArgs(a store.Allocation) []any {
	return []any{a.ID, a.Username, a.HostID, a.InstanceID, string(a.State), a.StateReason, rawText(a.Spec),
		a.ProvisionTaskID, a.ReleaseTaskID, a.CreatedBy, ms(a.CreatedAt), ms(a.UpdatedAt)}
}

// CreateAllocation implements store.Store. Defaults: State provisioning,
// CreatedAt now, UpdatedAt CreatedAt. The id, username and host id are
// required.
func (s *Store) CreateAllocation(ctx context.Context, a store.Allocation, audit ...store.AuditEvent) error {
	switch {
	case a.ID == "":
		return errors.New("create allocation: empty id")
	case a.Username == "":
		return fmt.Errorf("create allocation %q: empty username", a.ID)
	case a.HostID == "":
		return fmt.Errorf("create allocation %q: empty host id", a.ID)
	}
	if a.State == "" {
		a.State = api.AllocationProvisioning
	}
	if a.CreatedAt.IsZero() {
		a.CreatedAt = s.now()
	}
	if a.UpdatedAt.IsZero() {
		a.UpdatedAt = a.CreatedAt
	}
	err := s.withRecords(ctx, audit, func(db DB) error {
		_, err := db.Exec(ctx, `INSERT INTO allocations (`+allocationCols+`) VALUES
		($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`, allocationArgs(a)...)
		return err
	})
	if err != nil {
		if s.conflict(err) {
			return fmt.Errorf("create allocation %q: %w", a.ID, store.ErrConflict)
		}
		return fmt.Errorf("create allocation %q: %w", a.ID, err)
	}
	return nil
}

// GetAllocation implements store.Store.
func (s *Store) GetAllocation(ctx context.Context, id string) (store.Allocation, error) {
	a, err := scanAllocation(s.db.QueryRow(ctx, `SELECT `+allocationCols+` FROM allocations WHERE id = $1`, id))
	if err != nil {
		return store.Allocation{}, notFound(err, "get allocation %q", id)
	}
	return a, nil
}

// ListAllocations implements store.Store: oldest first (created_at, then id).
func (s *Store) ListAllocations(ctx context.Context, f store.AllocationFilter) ([]store.Allocation, error) {
	var (
		where []string
		args  []any
	)
	if f.HostID != "" {
		args = append(args, f.HostID)
		where = append(where, "host_id = $"+strconv.Itoa(len(args)))
	}
	if f.InstanceID != "" {
		args = append(args, f.InstanceID)
		where = append(where, "instance_id = $"+strconv.Itoa(len(args)))
	}
	if f.State != "" {
		args = append(args, string(f.State))
		where = append(where, "state = $"+strconv.Itoa(len(args)))
	}
	q := `SELECT ` + allocationCols + ` FROM allocations`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	out, err := collect(scanAllocation)(s.db.Query(ctx, q+` ORDER BY created_at, id`, args...))
	if err != nil {
		return nil, fmt.Errorf("list allocations: %w", err)
	}
	return out, nil
}

// UpdateAllocation implements store.Store. fn runs while the row is locked
// and must not call the store; it cannot change the id or CreatedAt.
// UpdatedAt is stored as fn leaves it: the store does not stamp it, so a fn
// that changes the record sets UpdatedAt itself.
func (s *Store) UpdateAllocation(ctx context.Context, id string, fn func(*store.Allocation) error) (store.Allocation, error) {
	return s.UpdateAllocationAudited(ctx, id, fn, nil)
}

// UpdateAllocationAudited implements store.Store: UpdateAllocation with
// audit's records in its transaction.
func (s *Store) UpdateAllocationAudited(ctx context.Context, id string, fn func(*store.Allocation) error,
	audit func(store.Allocation) []store.AuditEvent) (store.Allocation, error) {
	var out store.Allocation
	err := s.db.InTx(ctx, func(tx DB) error {
		a, err := scanAllocation(tx.QueryRow(ctx, `SELECT `+allocationCols+` FROM allocations WHERE id = $1`+s.d.ForUpdate, id))
		if err != nil {
			return notFound(err, "update allocation %q", id)
		}
		created := a.CreatedAt
		if err := fn(&a); err != nil {
			return err
		}
		a.ID, a.CreatedAt = id, created
		if _, err := tx.Exec(ctx, `UPDATE allocations SET username = $2, host_id = $3, instance_id = $4,
			state = $5, state_reason = $6, spec = $7, provision_task_id = $8, release_task_id = $9,
			created_by = $10, created_at = $11, updated_at = $12 WHERE id = $1`, allocationArgs(a)...); err != nil {
			return fmt.Errorf("update allocation %q: %w", id, err)
		}
		if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventAllocation, ID: id}); err != nil {
			return fmt.Errorf("update allocation %q: notify: %w", id, err)
		}
		if audit != nil {
			if err := s.appendAuditsTx(ctx, tx, audit(a)); err != nil {
				return fmt.Errorf("update allocation %q: audit: %w", id, err)
			}
		}
		// Read back so the caller sees exactly what a later GetAllocation
		// returns (millisecond UTC times, empty spec as nil).
		out, err = scanAllocation(tx.QueryRow(ctx, `SELECT `+allocationCols+` FROM allocations WHERE id = $1`, id))
		if err != nil {
			return fmt.Errorf("update allocation %q: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return store.Allocation{}, err
	}
	return out, nil
}
