package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

const sliceWorkflowCols = `allocation_id, host_id, status, step, spec, plan, result, provision_task_id,
	release_task_id, failed_step, signal, error, correlation_id, release_requested, created_at, updated_at`

func scanSliceWorkflow(r Row) (store.SliceWorkflow, error) {
	var (
		w                       store.SliceWorkflow
		status, spec, plan, res string
		released, created, upd  int64
	)
	if err := r.Scan(&w.AllocationID, &w.HostID, &status, &w.Step, &spec, &plan, &res, &w.ProvisionTaskID,
		&w.ReleaseTaskID, &w.FailedStep, &w.Signal, &w.Error, &w.CorrelationID, &released, &created, &upd); err != nil {
		return store.SliceWorkflow{}, err
	}
	w.Status, w.Spec, w.Plan, w.Result = store.SliceFlowStatus(status), textRaw(spec), textRaw(plan), textRaw(res)
	w.ReleaseRequested, w.CreatedAt, w.UpdatedAt = released != 0, tm(created), tm(upd)
	return w, nil
}

func sliceWorkflowArgs(w store.SliceWorkflow) []any {
	return []any{w.AllocationID, w.HostID, string(w.Status), w.Step, rawText(w.Spec), rawText(w.Plan), rawText(w.Result),
		w.ProvisionTaskID, w.ReleaseTaskID, w.FailedStep, w.Signal, w.Error, w.CorrelationID,
		boolInt(w.ReleaseRequested), ms(w.CreatedAt), ms(w.UpdatedAt)}
}

// CreateSliceWorkflow implements store.Store. Defaults: Status
// provisioning, CreatedAt now, UpdatedAt CreatedAt.
func (s *Store) CreateSliceWorkflow(ctx context.Context, w store.SliceWorkflow) error {
	if w.AllocationID == "" {
		return errors.New("create slice workflow: empty allocation id")
	}
	if w.Status == "" {
		w.Status = store.SliceFlowProvisioning
	}
	if w.CreatedAt.IsZero() {
		w.CreatedAt = s.now()
	}
	if w.UpdatedAt.IsZero() {
		w.UpdatedAt = w.CreatedAt
	}
	_, err := s.db.Exec(ctx, `INSERT INTO slice_workflows (`+sliceWorkflowCols+`) VALUES
		($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`, sliceWorkflowArgs(w)...)
	if err != nil {
		if s.d.IsUniqueViolation(err) {
			return fmt.Errorf("create slice workflow %q: %w", w.AllocationID, store.ErrConflict)
		}
		return fmt.Errorf("create slice workflow %q: %w", w.AllocationID, err)
	}
	return nil
}

// GetSliceWorkflow implements store.Store.
func (s *Store) GetSliceWorkflow(ctx context.Context, id string) (store.SliceWorkflow, error) {
	w, err := scanSliceWorkflow(s.db.QueryRow(ctx, `SELECT `+sliceWorkflowCols+` FROM slice_workflows WHERE allocation_id = $1`, id))
	if err != nil {
		return store.SliceWorkflow{}, notFound(err, "get slice workflow %q", id)
	}
	return w, nil
}

// ListSliceWorkflows implements store.Store.
func (s *Store) ListSliceWorkflows(ctx context.Context, unfinished bool) ([]store.SliceWorkflow, error) {
	q := `SELECT ` + sliceWorkflowCols + ` FROM slice_workflows`
	if unfinished {
		q += ` WHERE status IN ('provisioning', 'compensating', 'releasing')`
	}
	out, err := collect(scanSliceWorkflow)(s.db.Query(ctx, q+` ORDER BY created_at, allocation_id`))
	if err != nil {
		return nil, fmt.Errorf("list slice workflows: %w", err)
	}
	return out, nil
}

// UpdateSliceWorkflow implements store.Store. fn runs while the row is
// locked and must not call the store; it cannot change the allocation id
// or CreatedAt. Publishes EventAllocation for the allocation.
func (s *Store) UpdateSliceWorkflow(ctx context.Context, id string, fn func(*store.SliceWorkflow) error) (store.SliceWorkflow, error) {
	var out store.SliceWorkflow
	err := s.db.InTx(ctx, func(tx DB) error {
		w, err := scanSliceWorkflow(tx.QueryRow(ctx, `SELECT `+sliceWorkflowCols+` FROM slice_workflows WHERE allocation_id = $1`+s.d.ForUpdate, id))
		if err != nil {
			return notFound(err, "update slice workflow %q", id)
		}
		created := w.CreatedAt
		if err := fn(&w); err != nil {
			return err
		}
		w.AllocationID, w.CreatedAt = id, created
		if _, err := tx.Exec(ctx, `UPDATE slice_workflows SET host_id = $2, status = $3, step = $4, spec = $5, plan = $6,
			result = $7, provision_task_id = $8, release_task_id = $9, failed_step = $10, signal = $11, error = $12,
			correlation_id = $13, release_requested = $14, created_at = $15, updated_at = $16 WHERE allocation_id = $1`,
			sliceWorkflowArgs(w)...); err != nil {
			return fmt.Errorf("update slice workflow %q: %w", id, err)
		}
		if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventAllocation, ID: id}); err != nil {
			return fmt.Errorf("update slice workflow %q: notify: %w", id, err)
		}
		out, err = scanSliceWorkflow(tx.QueryRow(ctx, `SELECT `+sliceWorkflowCols+` FROM slice_workflows WHERE allocation_id = $1`, id))
		if err != nil {
			return fmt.Errorf("update slice workflow %q: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return store.SliceWorkflow{}, err
	}
	return out, nil
}

const sliceStepCols = `idempotency_key, allocation_id, step, seq, state, task_id, detail, started_at, ended_at`

func scanSliceStep(r Row) (store.SliceStep, error) {
	var (
		st         store.SliceStep
		start, end int64
	)
	if err := r.Scan(&st.Key, &st.AllocationID, &st.Step, &st.Seq, &st.State, &st.TaskID, &st.Detail, &start, &end); err != nil {
		return store.SliceStep{}, err
	}
	st.StartedAt, st.EndedAt = tm(start), tm(end)
	return st, nil
}

// BeginSliceStep implements store.Store: the insert is conditional on the
// key, so of two callers recording the same step one records it and both
// get the stored record.
func (s *Store) BeginSliceStep(ctx context.Context, st store.SliceStep) (store.SliceStep, bool, error) {
	if st.Key == "" || st.AllocationID == "" || st.Step == "" {
		return store.SliceStep{}, false, errors.New("begin slice step: key, allocation id and step are required")
	}
	if st.State == "" {
		st.State = store.SliceStepStarted
	}
	if st.StartedAt.IsZero() {
		st.StartedAt = s.now()
	}
	var (
		out     store.SliceStep
		created bool
	)
	err := s.db.InTx(ctx, func(tx DB) error {
		n, err := tx.Exec(ctx, `INSERT INTO slice_workflow_steps (`+sliceStepCols+`)
			SELECT $1, $2, $3, COALESCE(MAX(seq), 0) + 1, $4, $5, $6, $7, $8 FROM slice_workflow_steps WHERE allocation_id = $2
			ON CONFLICT (idempotency_key) DO NOTHING`,
			st.Key, st.AllocationID, st.Step, st.State, st.TaskID, st.Detail, ms(st.StartedAt), ms(st.EndedAt))
		if err != nil {
			return fmt.Errorf("begin slice step %q: %w", st.Key, err)
		}
		created = n > 0
		out, err = scanSliceStep(tx.QueryRow(ctx, `SELECT `+sliceStepCols+` FROM slice_workflow_steps WHERE idempotency_key = $1`, st.Key))
		if err != nil {
			return fmt.Errorf("begin slice step %q: %w", st.Key, err)
		}
		return nil
	})
	if err != nil {
		if s.d.IsUniqueViolation(err) {
			// A concurrent first insert won; read what it stored.
			out, err = scanSliceStep(s.db.QueryRow(ctx, `SELECT `+sliceStepCols+` FROM slice_workflow_steps WHERE idempotency_key = $1`, st.Key))
			if err != nil {
				return store.SliceStep{}, false, notFound(err, "begin slice step %q", st.Key)
			}
			return out, false, nil
		}
		return store.SliceStep{}, false, err
	}
	return out, created, nil
}

// UpdateSliceStep implements store.Store.
func (s *Store) UpdateSliceStep(ctx context.Context, st store.SliceStep) error {
	n, err := s.db.Exec(ctx, `UPDATE slice_workflow_steps SET state = $2, task_id = $3, detail = $4, ended_at = $5
		WHERE idempotency_key = $1`, st.Key, st.State, st.TaskID, st.Detail, ms(st.EndedAt))
	if err != nil {
		return fmt.Errorf("update slice step %q: %w", st.Key, err)
	}
	if n == 0 {
		return fmt.Errorf("update slice step %q: %w", st.Key, store.ErrNotFound)
	}
	return nil
}

// ListSliceSteps implements store.Store.
func (s *Store) ListSliceSteps(ctx context.Context, id string) ([]store.SliceStep, error) {
	out, err := collect(scanSliceStep)(s.db.Query(ctx, `SELECT `+sliceStepCols+` FROM slice_workflow_steps
		WHERE allocation_id = $1 ORDER BY seq, idempotency_key`, id))
	if err != nil {
		return nil, fmt.Errorf("list slice steps of %q: %w", id, err)
	}
	return out, nil
}

// LeaseSlots implements store.Store: one transaction; a slot the
// allocation already holds is skipped, one another allocation holds (or
// a concurrent insert of the same slot, caught by the primary key) aborts
// the whole lease with ErrConflict.
func (s *Store) LeaseSlots(ctx context.Context, id, hostID string, slotIDs []string, at time.Time) error {
	if id == "" || hostID == "" || len(slotIDs) == 0 {
		return errors.New("lease slots: allocation id, host id and slots are required")
	}
	if at.IsZero() {
		at = s.now()
	}
	err := s.db.InTx(ctx, func(tx DB) error {
		for _, slot := range slotIDs {
			var holder string
			err := tx.QueryRow(ctx, `SELECT allocation_id FROM slot_leases WHERE host_id = $1 AND slot_id = $2`, hostID, slot).Scan(&holder)
			switch {
			case err == nil && holder == id:
				continue
			case err == nil:
				return fmt.Errorf("lease slot %s/%s for %s: held by %s: %w", hostID, slot, id, holder, store.ErrConflict)
			case !errors.Is(err, ErrNoRows):
				return fmt.Errorf("lease slot %s/%s for %s: %w", hostID, slot, id, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO slot_leases (host_id, slot_id, allocation_id, leased_at) VALUES ($1, $2, $3, $4)`,
				hostID, slot, id, ms(at)); err != nil {
				if s.d.IsUniqueViolation(err) {
					return fmt.Errorf("lease slot %s/%s for %s: %w", hostID, slot, id, store.ErrConflict)
				}
				return fmt.Errorf("lease slot %s/%s for %s: %w", hostID, slot, id, err)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, store.ErrConflict) && s.d.IsUniqueViolation(err) {
		return fmt.Errorf("lease slots for %s: %w", id, store.ErrConflict)
	}
	return err
}

// ListSlotLeases implements store.Store.
func (s *Store) ListSlotLeases(ctx context.Context, hostID string) ([]store.SlotLease, error) {
	q, args := `SELECT host_id, slot_id, allocation_id, leased_at FROM slot_leases`, []any{}
	if hostID != "" {
		q, args = q+` WHERE host_id = $1`, append(args, hostID)
	}
	out, err := collect(func(r Row) (store.SlotLease, error) {
		var (
			l  store.SlotLease
			at int64
		)
		err := r.Scan(&l.HostID, &l.SlotID, &l.AllocationID, &at)
		l.LeasedAt = tm(at)
		return l, err
	})(s.db.Query(ctx, q+` ORDER BY host_id, slot_id`, args...))
	if err != nil {
		return nil, fmt.Errorf("list slot leases: %w", err)
	}
	return out, nil
}

// FreeSlotLeases implements store.Store.
func (s *Store) FreeSlotLeases(ctx context.Context, id string) (int, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM slot_leases WHERE allocation_id = $1`, id)
	if err != nil {
		return 0, fmt.Errorf("free slot leases of %s: %w", id, err)
	}
	return int(n), nil
}
