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

const instanceCols = `id, name, group_name, host_id, labels, spec, desired_state, generation,
	phase, reason_code, message, observed_generation, runtime, created_by,
	created_at, updated_at, status_at`

func scanInstance(r Row) (store.Instance, error) {
	var (
		in                                   store.Instance
		labels, spec, desired, phase, reason string
		runtime                              string
		created, updated, statusAt           int64
	)
	if err := r.Scan(&in.ID, &in.Name, &in.Group, &in.HostID, &labels, &spec, &desired, &in.Generation,
		&phase, &reason, &in.Message, &in.ObservedGeneration, &runtime, &in.CreatedBy,
		&created, &updated, &statusAt); err != nil {
		return store.Instance{}, err
	}
	var err error
	if in.Labels, err = textLabels(labels); err != nil {
		return store.Instance{}, fmt.Errorf("instance %q: %w", in.ID, err)
	}
	in.Spec, in.Runtime = textRaw(spec), textRaw(runtime)
	in.DesiredState, in.Phase, in.ReasonCode = api.DesiredState(desired), api.InstancePhase(phase), api.ReasonCode(reason)
	in.CreatedAt, in.UpdatedAt, in.StatusAt = tm(created), tm(updated), tm(statusAt)
	return in, nil
}

// instanceArgs returns in's column values in instanceCols order.
func instanceArgs(in store.Instance) ([]any, error) {
	labels, err := labelsText(in.Labels)
	if err != nil {
		return nil, err
	}
	return []any{in.ID, in.Name, in.Group, in.HostID, labels, rawText(in.Spec), string(in.DesiredState), in.Generation,
		string(in.Phase), string(in.ReasonCode), in.Message, in.ObservedGeneration, rawText(in.Runtime), in.CreatedBy,
		ms(in.CreatedAt), ms(in.UpdatedAt), ms(in.StatusAt)}, nil
}

// CreateInstance implements store.Store. Defaults: DesiredState running,
// Generation 1, Phase Pending, CreatedAt now, UpdatedAt CreatedAt.
func (s *Store) CreateInstance(ctx context.Context, in store.Instance) error {
	return s.createInstance(ctx, in, nil, nil)
}

// CreateInstanceRecorded implements store.Store.
func (s *Store) CreateInstanceRecorded(ctx context.Context, in store.Instance, ev store.InstanceEvent, audit ...store.AuditEvent) error {
	return s.createInstance(ctx, in, &ev, audit)
}

// createInstance inserts in and, when ev is not nil, its first event,
// and appends audit.
func (s *Store) createInstance(ctx context.Context, in store.Instance, ev *store.InstanceEvent, audit []store.AuditEvent) error {
	switch {
	case in.ID == "":
		return errors.New("create instance: empty id")
	case in.Name == "":
		return fmt.Errorf("create instance %q: empty name", in.ID)
	case in.HostID == "":
		return fmt.Errorf("create instance %q: empty host id", in.ID)
	}
	if in.DesiredState == "" {
		in.DesiredState = api.DesiredRunning
	}
	if in.Generation == 0 {
		in.Generation = 1
	}
	if in.Phase == "" {
		in.Phase = api.InstancePending
	}
	if in.CreatedAt.IsZero() {
		in.CreatedAt = s.now()
	}
	if in.UpdatedAt.IsZero() {
		in.UpdatedAt = in.CreatedAt
	}
	args, err := instanceArgs(in)
	if err != nil {
		return fmt.Errorf("create instance %q: %w", in.ID, err)
	}
	return s.db.InTx(ctx, func(tx DB) error {
		_, err := tx.Exec(ctx, `INSERT INTO instances (`+instanceCols+`) VALUES
			($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)`, args...)
		if err != nil {
			if s.d.IsUniqueViolation(err) {
				return fmt.Errorf("create instance %q (name %q): %w", in.ID, in.Name, store.ErrConflict)
			}
			return fmt.Errorf("create instance %q: %w", in.ID, err)
		}
		if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventInstance, ID: in.HostID}); err != nil {
			return fmt.Errorf("create instance %q: notify: %w", in.ID, err)
		}
		if ev != nil {
			ev.InstanceID = in.ID
			if err := s.appendInstanceEventTx(ctx, tx, *ev); err != nil {
				return err
			}
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("create instance %q: audit: %w", in.ID, err)
		}
		return nil
	})
}

// GetInstance implements store.Store.
func (s *Store) GetInstance(ctx context.Context, id string) (store.Instance, error) {
	in, err := scanInstance(s.db.QueryRow(ctx, `SELECT `+instanceCols+` FROM instances WHERE id = $1`, id))
	if err != nil {
		return store.Instance{}, notFound(err, "get instance %q", id)
	}
	return in, nil
}

// GetInstanceByName implements store.Store.
func (s *Store) GetInstanceByName(ctx context.Context, name string) (store.Instance, error) {
	in, err := scanInstance(s.db.QueryRow(ctx, `SELECT `+instanceCols+` FROM instances WHERE name = $1`, name))
	if err != nil {
		return store.Instance{}, notFound(err, "get instance named %q", name)
	}
	return in, nil
}

// ListInstances implements store.Store.
func (s *Store) ListInstances(ctx context.Context, f store.InstanceFilter) ([]store.Instance, error) {
	var (
		where []string
		args  []any
	)
	if f.HostID != "" {
		args = append(args, f.HostID)
		where = append(where, "host_id = $"+strconv.Itoa(len(args)))
	}
	if f.Group != "" {
		args = append(args, f.Group)
		where = append(where, "group_name = $"+strconv.Itoa(len(args)))
	}
	q := `SELECT ` + instanceCols + ` FROM instances`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	out, err := collect(scanInstance)(s.db.Query(ctx, q+` ORDER BY name`, args...))
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	return out, nil
}

// UpdateInstance implements store.Store. fn runs while the row is locked and
// must not call the store; it cannot change the id or CreatedAt. When fn
// leaves UpdatedAt as it was, UpdatedAt is set to now.
func (s *Store) UpdateInstance(ctx context.Context, id string, fn func(*store.Instance) error) (store.Instance, error) {
	return s.UpdateInstanceRecorded(ctx, id, fn, nil)
}

// UpdateInstanceRecorded implements store.Store.
func (s *Store) UpdateInstanceRecorded(ctx context.Context, id string, fn func(*store.Instance) error,
	record func(before, after store.Instance) store.InstanceRecords) (store.Instance, error) {
	var out store.Instance
	err := s.db.InTx(ctx, func(tx DB) error {
		in, err := scanInstance(tx.QueryRow(ctx, `SELECT `+instanceCols+` FROM instances WHERE id = $1`+s.d.ForUpdate, id))
		if err != nil {
			return notFound(err, "update instance %q", id)
		}
		prev := in
		before, oldHost, created := in.UpdatedAt, in.HostID, in.CreatedAt
		if err := fn(&in); err != nil {
			return err
		}
		in.ID, in.CreatedAt = id, created
		if in.UpdatedAt.Equal(before) {
			in.UpdatedAt = s.now()
		}
		args, err := instanceArgs(in)
		if err != nil {
			return fmt.Errorf("update instance %q: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE instances SET name = $2, group_name = $3, host_id = $4, labels = $5,
			spec = $6, desired_state = $7, generation = $8, phase = $9, reason_code = $10, message = $11,
			observed_generation = $12, runtime = $13, created_by = $14, created_at = $15, updated_at = $16,
			status_at = $17 WHERE id = $1`, args...); err != nil {
			if s.d.IsUniqueViolation(err) {
				return fmt.Errorf("update instance %q (name %q): %w", id, in.Name, store.ErrConflict)
			}
			return fmt.Errorf("update instance %q: %w", id, err)
		}
		hosts := []string{in.HostID}
		if oldHost != in.HostID {
			hosts = append(hosts, oldHost)
		}
		for _, h := range hosts {
			if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventInstance, ID: h}); err != nil {
				return fmt.Errorf("update instance %q: notify: %w", id, err)
			}
		}
		// Read back so the caller sees exactly what a later GetInstance
		// returns (millisecond times, empty labels as nil).
		out, err = scanInstance(tx.QueryRow(ctx, `SELECT `+instanceCols+` FROM instances WHERE id = $1`, id))
		if err != nil {
			return fmt.Errorf("update instance %q: %w", id, err)
		}
		if record == nil {
			return nil
		}
		recs := record(prev, out)
		if ev := recs.Event; ev != nil {
			ev.InstanceID = id
			if err := s.appendInstanceEventTx(ctx, tx, *ev); err != nil {
				return err
			}
		}
		if err := s.appendAuditsTx(ctx, tx, recs.Audit); err != nil {
			return fmt.Errorf("update instance %q: audit: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return store.Instance{}, err
	}
	return out, nil
}

// DeleteInstance implements store.Store; the instance's events go with it.
func (s *Store) DeleteInstance(ctx context.Context, id string, audit ...store.AuditEvent) error {
	return s.db.InTx(ctx, func(tx DB) error {
		var host string
		err := tx.QueryRow(ctx, `DELETE FROM instances WHERE id = $1 RETURNING host_id`, id).Scan(&host)
		if err != nil {
			return notFound(err, "delete instance %q", id)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM instance_events WHERE instance_id = $1`, id); err != nil {
			return fmt.Errorf("delete instance %q: events: %w", id, err)
		}
		if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventInstance, ID: host}); err != nil {
			return fmt.Errorf("delete instance %q: notify: %w", id, err)
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("delete instance %q: audit: %w", id, err)
		}
		return nil
	})
}
