package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/cp/store"
)

const preflightCols = `id, host_id, correlation_id, ok, failed_hop, signal, report, created_by, created_at`

func scanPreflightRun(r Row) (store.PreflightRun, error) {
	var (
		p           store.PreflightRun
		ok, created int64
		report      string
	)
	if err := r.Scan(&p.ID, &p.HostID, &p.CorrelationID, &ok, &p.FailedHop, &p.Signal, &report, &p.CreatedBy,
		&created); err != nil {
		return store.PreflightRun{}, err
	}
	p.OK, p.Report, p.CreatedAt = ok != 0, textRaw(report), tm(created)
	return p, nil
}

// CreatePreflightRun implements store.Store. A zero CreatedAt is now.
func (s *Store) CreatePreflightRun(ctx context.Context, p store.PreflightRun) error {
	if p.ID == "" {
		return errors.New("create preflight run: empty id")
	}
	if p.CreatedAt.IsZero() {
		p.CreatedAt = s.now()
	}
	_, err := s.db.Exec(ctx, `INSERT INTO preflight_runs (`+preflightCols+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		p.ID, p.HostID, p.CorrelationID, boolInt(p.OK), p.FailedHop, p.Signal, rawText(p.Report), p.CreatedBy,
		ms(p.CreatedAt))
	if err != nil {
		if s.d.IsUniqueViolation(err) {
			return fmt.Errorf("create preflight run %q: %w", p.ID, store.ErrConflict)
		}
		return fmt.Errorf("create preflight run %q: %w", p.ID, err)
	}
	return nil
}

// GetPreflightRun implements store.Store.
func (s *Store) GetPreflightRun(ctx context.Context, id string) (store.PreflightRun, error) {
	p, err := scanPreflightRun(s.db.QueryRow(ctx, `SELECT `+preflightCols+` FROM preflight_runs WHERE id = $1`, id))
	if err != nil {
		return store.PreflightRun{}, notFound(err, "get preflight run %q", id)
	}
	return p, nil
}

// ListPreflightRuns implements store.Store.
func (s *Store) ListPreflightRuns(ctx context.Context, f store.PreflightFilter) ([]store.PreflightRun, error) {
	var (
		where []string
		args  []any
	)
	if f.HostID != "" {
		args = append(args, f.HostID)
		where = append(where, "host_id = $"+strconv.Itoa(len(args)))
	}
	if f.CorrelationID != "" {
		args = append(args, f.CorrelationID)
		where = append(where, "correlation_id = $"+strconv.Itoa(len(args)))
	}
	q := `SELECT ` + preflightCols + ` FROM preflight_runs`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, limit(f.Limit))
	q += ` ORDER BY created_at DESC, id DESC LIMIT $` + strconv.Itoa(len(args))
	out, err := collect(scanPreflightRun)(s.db.Query(ctx, q, args...))
	if err != nil {
		return nil, fmt.Errorf("list preflight runs: %w", err)
	}
	return out, nil
}
