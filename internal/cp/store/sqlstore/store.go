package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Store implements every store.Store method except Subscribe, Ping and
// Close, which belong to the adapter that owns the connections and embeds
// *Store.
type Store struct {
	db  DB
	d   Dialect
	now func() time.Time
}

// New returns a Store running on db with dialect d. A nil d.Notify drops
// events; a nil d.IsUniqueViolation never reports conflicts.
func New(db DB, d Dialect) *Store {
	if d.Notify == nil {
		d.Notify = func(context.Context, DB, store.Event) error { return nil }
	}
	if d.IsUniqueViolation == nil {
		d.IsUniqueViolation = func(error) bool { return false }
	}
	return &Store{db: db, d: d, now: func() time.Time { return time.Now().UTC() }}
}

// DB returns the handle the store runs on.
func (s *Store) DB() DB { return s.db }

const hostCols = `id, os_family, labels, enabled, revoked, status, status_reason,
	hostname, selected_accel, agent_version, capabilities, capacity,
	token_hash, token_expires_at, token_used, cert_serial, cert_not_after,
	enrolled_at, last_seen_at, created_at, updated_at, draining,
	last_failure_signal, last_failure_detail, last_failure_correlation_id, last_failure_at,
	last_successful_preflight_at, profile_api_url, profile_terminal_url,
	health, health_summary, health_checked_at, health_task_id`

func scanHost(r Row) (store.Host, error) {
	var (
		h                                                   store.Host
		labels, status, caps, capacity                      string
		enabled, revoked, tokenUsed, draining               int64
		tokenExp, certNotAfter, enrolled, seen, created, up int64
		failedAt, preflightAt, healthAt                     int64
		health                                              string
	)
	err := r.Scan(&h.ID, &h.OSFamily, &labels, &enabled, &revoked, &status, &h.StatusReason,
		&h.Hostname, &h.SelectedAccel, &h.AgentVersion, &caps, &capacity,
		&h.TokenHash, &tokenExp, &tokenUsed, &h.CertSerial, &certNotAfter,
		&enrolled, &seen, &created, &up, &draining,
		&h.LastFailure.Signal, &h.LastFailure.Detail, &h.LastFailure.CorrelationID, &failedAt,
		&preflightAt, &h.Profile.APIURL, &h.Profile.TerminalURL,
		&health, &h.Health.Summary, &healthAt, &h.Health.TaskID)
	if err != nil {
		return store.Host{}, err
	}
	if h.Labels, err = textLabels(labels); err != nil {
		return store.Host{}, fmt.Errorf("host %q: %w", h.ID, err)
	}
	h.Enabled, h.Revoked, h.TokenUsed, h.Draining = enabled != 0, revoked != 0, tokenUsed != 0, draining != 0
	h.Status = api.HostStatus(status)
	h.Capabilities, h.Capacity = textRaw(caps), textRaw(capacity)
	h.TokenExpiresAt, h.CertNotAfter, h.EnrolledAt = tm(tokenExp), tm(certNotAfter), tm(enrolled)
	h.LastSeenAt, h.CreatedAt, h.UpdatedAt = tm(seen), tm(created), tm(up)
	h.LastFailure.At, h.LastSuccessfulPreflightAt = tm(failedAt), tm(preflightAt)
	h.Health.State, h.Health.CheckedAt = api.HostHealth(health), tm(healthAt)
	return h, nil
}

// hostArgs returns h's column values in hostCols order.
func hostArgs(h store.Host) ([]any, error) {
	labels, err := labelsText(h.Labels)
	if err != nil {
		return nil, err
	}
	return []any{h.ID, h.OSFamily, labels, boolInt(h.Enabled), boolInt(h.Revoked), string(h.Status), h.StatusReason,
		h.Hostname, h.SelectedAccel, h.AgentVersion, rawText(h.Capabilities), rawText(h.Capacity),
		h.TokenHash, ms(h.TokenExpiresAt), boolInt(h.TokenUsed), h.CertSerial, ms(h.CertNotAfter),
		ms(h.EnrolledAt), ms(h.LastSeenAt), ms(h.CreatedAt), ms(h.UpdatedAt), boolInt(h.Draining),
		h.LastFailure.Signal, h.LastFailure.Detail, h.LastFailure.CorrelationID, ms(h.LastFailure.At),
		ms(h.LastSuccessfulPreflightAt), h.Profile.APIURL, h.Profile.TerminalURL,
		string(h.Health.State), h.Health.Summary, ms(h.Health.CheckedAt), h.Health.TaskID}, nil
}

// CreateHost implements store.Store. An empty Status is stored as unknown, a
// zero CreatedAt as now and a zero UpdatedAt as CreatedAt.
func (s *Store) CreateHost(ctx context.Context, h store.Host, audit ...store.AuditEvent) error {
	if h.ID == "" {
		return errors.New("create host: empty id")
	}
	if h.Status == "" {
		h.Status = api.HostUnknown
	}
	if h.CreatedAt.IsZero() {
		h.CreatedAt = s.now()
	}
	if h.UpdatedAt.IsZero() {
		h.UpdatedAt = h.CreatedAt
	}
	args, err := hostArgs(h)
	if err != nil {
		return fmt.Errorf("create host %q: %w", h.ID, err)
	}
	err = s.withRecords(ctx, audit, func(db DB) error {
		_, err := db.Exec(ctx, `INSERT INTO hosts (`+hostCols+`) VALUES
		($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22,
		$23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33)`, args...)
		return err
	})
	if err != nil {
		if s.conflict(err) {
			return fmt.Errorf("create host %q: %w", h.ID, store.ErrConflict)
		}
		return fmt.Errorf("create host %q: %w", h.ID, err)
	}
	return nil
}

// GetHost implements store.Store.
func (s *Store) GetHost(ctx context.Context, id string) (store.Host, error) {
	h, err := scanHost(s.db.QueryRow(ctx, `SELECT `+hostCols+` FROM hosts WHERE id = $1`, id))
	if err != nil {
		return store.Host{}, notFound(err, "get host %q", id)
	}
	return h, nil
}

// ListHosts implements store.Store.
func (s *Store) ListHosts(ctx context.Context) ([]store.Host, error) {
	out, err := collect(scanHost)(s.db.Query(ctx, `SELECT `+hostCols+` FROM hosts ORDER BY id`))
	if err != nil {
		return nil, fmt.Errorf("list hosts: %w", err)
	}
	return out, nil
}

// hostStateCols are the columns of a store.HostState, in scanHostState's order.
const hostStateCols = `id, enabled, revoked, status, enrolled_at, last_seen_at, capacity,
	last_failure_signal, last_failure_detail, last_failure_correlation_id, last_failure_at, updated_at`

func scanHostState(r Row) (store.HostState, error) {
	var (
		h                store.HostState
		enabled, revoked int64
		status, capacity string
		enrolled, seen   int64
		failedAt, up     int64
	)
	if err := r.Scan(&h.ID, &enabled, &revoked, &status, &enrolled, &seen, &capacity,
		&h.LastFailure.Signal, &h.LastFailure.Detail, &h.LastFailure.CorrelationID, &failedAt, &up); err != nil {
		return store.HostState{}, err
	}
	h.Enabled, h.Revoked, h.Status = enabled != 0, revoked != 0, api.HostStatus(status)
	h.EnrolledAt, h.LastSeenAt = tm(enrolled), tm(seen)
	h.Capacity, h.LastFailure.At, h.UpdatedAt = textRaw(capacity), tm(failedAt), tm(up)
	return h, nil
}

// GetHostState implements store.Store.
func (s *Store) GetHostState(ctx context.Context, id string) (store.HostState, error) {
	h, err := scanHostState(s.db.QueryRow(ctx, `SELECT `+hostStateCols+` FROM hosts WHERE id = $1`, id))
	if err != nil {
		return store.HostState{}, notFound(err, "get host state %q", id)
	}
	return h, nil
}

// ListHostStates implements store.Store.
func (s *Store) ListHostStates(ctx context.Context) ([]store.HostState, error) {
	out, err := collect(scanHostState)(s.db.Query(ctx, `SELECT `+hostStateCols+` FROM hosts ORDER BY id`))
	if err != nil {
		return nil, fmt.Errorf("list host states: %w", err)
	}
	return out, nil
}

// ListHostLiveness implements store.Store.
func (s *Store) ListHostLiveness(ctx context.Context) ([]store.HostLiveness, error) {
	out, err := collect(func(r Row) (store.HostLiveness, error) {
		var (
			h                store.HostLiveness
			enabled, revoked int64
			status           string
			seen             int64
		)
		if err := r.Scan(&h.ID, &enabled, &revoked, &status, &seen); err != nil {
			return store.HostLiveness{}, err
		}
		h.Enabled, h.Revoked, h.Status, h.LastSeenAt = enabled != 0, revoked != 0, api.HostStatus(status), tm(seen)
		return h, nil
	})(s.db.Query(ctx, `SELECT id, enabled, revoked, status, last_seen_at FROM hosts ORDER BY id`))
	if err != nil {
		return nil, fmt.Errorf("list host liveness: %w", err)
	}
	return out, nil
}

// HostStatesSinceSQL is ListHostStatesSince's statement, $1 the time in
// unix ms. It has no ORDER BY: with one, SQLite scans the whole table in
// id order instead of the few rows index hosts_updated_at finds
// (sqlite's TestHostStatesSinceUsesIndex); the rows are sorted here.
const HostStatesSinceSQL = `SELECT ` + hostStateCols + ` FROM hosts WHERE updated_at >= $1`

// ListHostStatesSince implements store.Store.
func (s *Store) ListHostStatesSince(ctx context.Context, since time.Time) ([]store.HostState, error) {
	out, err := collect(scanHostState)(s.db.Query(ctx, HostStatesSinceSQL, ms(since)))
	if err != nil {
		return nil, fmt.Errorf("list host states since %s: %w", since.Format(time.RFC3339Nano), err)
	}
	slices.SortFunc(out, func(a, b store.HostState) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// UpdateHost implements store.Store. fn runs while the row is locked and must
// not call the store. fn cannot change the id. When fn leaves UpdatedAt as it
// was, UpdatedAt is set to now.
func (s *Store) UpdateHost(ctx context.Context, id string, fn func(*store.Host) error) (store.Host, error) {
	return s.UpdateHostAudited(ctx, id, fn, nil)
}

// UpdateHostAudited implements store.Store; audit sees the host as read
// and as fn left it, before it is written.
func (s *Store) UpdateHostAudited(ctx context.Context, id string, fn func(*store.Host) error,
	audit func(before, after store.Host) []store.AuditEvent) (store.Host, error) {
	var out store.Host
	err := s.db.InTx(ctx, func(tx DB) error {
		h, err := scanHost(tx.QueryRow(ctx, `SELECT `+hostCols+` FROM hosts WHERE id = $1`+s.d.ForUpdate, id))
		if err != nil {
			return notFound(err, "update host %q", id)
		}
		read := h // its maps are fn's too; audit reads the status fields
		if err := fn(&h); err != nil {
			return err
		}
		h.ID = id
		if h.UpdatedAt.Equal(read.UpdatedAt) {
			h.UpdatedAt = s.now()
		}
		if audit != nil {
			if err := s.appendAuditsTx(ctx, tx, audit(read, h)); err != nil {
				return fmt.Errorf("update host %q: audit: %w", id, err)
			}
		}
		args, err := hostArgs(h)
		if err != nil {
			return fmt.Errorf("update host %q: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE hosts SET os_family = $2, labels = $3, enabled = $4, revoked = $5,
			status = $6, status_reason = $7, hostname = $8, selected_accel = $9, agent_version = $10,
			capabilities = $11, capacity = $12, token_hash = $13, token_expires_at = $14, token_used = $15,
			cert_serial = $16, cert_not_after = $17, enrolled_at = $18, last_seen_at = $19, created_at = $20,
			updated_at = $21, draining = $22, last_failure_signal = $23, last_failure_detail = $24,
			last_failure_correlation_id = $25, last_failure_at = $26, last_successful_preflight_at = $27,
			profile_api_url = $28, profile_terminal_url = $29, health = $30, health_summary = $31,
			health_checked_at = $32, health_task_id = $33 WHERE id = $1`, args...); err != nil {
			return fmt.Errorf("update host %q: %w", id, err)
		}
		if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventHost, ID: id}); err != nil {
			return fmt.Errorf("update host %q: notify: %w", id, err)
		}
		// Read back so the caller sees exactly what a later GetHost returns
		// (millisecond times, empty labels as nil).
		out, err = scanHost(tx.QueryRow(ctx, `SELECT `+hostCols+` FROM hosts WHERE id = $1`, id))
		if err != nil {
			return fmt.Errorf("update host %q: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return store.Host{}, err
	}
	return out, nil
}

// TouchHosts implements store.Store. Observations of the same host are
// merged (newest wins); unknown ids are ignored. Revived hosts get
// UpdatedAt = now. No event is published: liveness is not a record change.
func (s *Store) TouchHosts(ctx context.Context, seen []store.Seen, audit func(id string) store.AuditEvent) ([]string, error) {
	if len(seen) == 0 {
		return nil, nil
	}
	newest := make(map[string]int64, len(seen))
	for _, o := range seen {
		at := ms(o.At)
		if cur, ok := newest[o.HostID]; !ok || at > cur {
			newest[o.HostID] = at
		}
	}
	// Sorted ids make concurrent batches lock rows in the same order.
	ids := make([]string, 0, len(newest))
	for id := range newest {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ats := make([]int64, len(ids))
	for i, id := range ids {
		ats[i] = newest[id]
	}
	now := ms(s.now())
	var revived []string
	err := s.db.InTx(ctx, func(tx DB) error {
		var err error
		if s.d.TouchHosts != nil {
			revived, err = s.d.TouchHosts(ctx, tx, ids, ats, now)
		} else {
			revived, err = s.touchHostsLoop(ctx, tx, ids, ats, now)
		}
		if err != nil || audit == nil || len(revived) == 0 {
			return err
		}
		slices.Sort(revived)
		var es []store.AuditEvent
		for _, id := range revived {
			if e := audit(id); e.Action != "" {
				es = append(es, e)
			}
		}
		return s.appendAuditsTx(ctx, tx, es)
	})
	if err != nil {
		return nil, fmt.Errorf("touch hosts: %w", err)
	}
	slices.Sort(revived)
	return revived, nil
}

// touchHostsLoop is the portable TouchHosts: one read and at most one
// write per host, in db's transaction.
func (s *Store) touchHostsLoop(ctx context.Context, db DB, ids []string, ats []int64, now int64) ([]string, error) {
	var revived []string
	err := db.InTx(ctx, func(tx DB) error {
		revived = revived[:0]
		for i, id := range ids {
			var status string
			var last int64
			err := tx.QueryRow(ctx, `SELECT status, last_seen_at FROM hosts WHERE id = $1`+s.d.ForUpdate, id).Scan(&status, &last)
			if errors.Is(err, ErrNoRows) {
				continue
			}
			if err != nil {
				return err
			}
			revive := status == string(api.HostStale) || status == string(api.HostUnknown)
			if !revive && ats[i] <= last {
				continue
			}
			if revive {
				_, err = tx.Exec(ctx, `UPDATE hosts SET last_seen_at = $2, status = 'healthy', updated_at = $3 WHERE id = $1`,
					id, max(last, ats[i]), now)
				revived = append(revived, id)
			} else {
				_, err = tx.Exec(ctx, `UPDATE hosts SET last_seen_at = $2 WHERE id = $1`, id, ats[i])
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	return revived, err
}

// staleBatch is the most hosts one MarkStale transaction marks: a sweep
// that finds a whole fleet silent (20,000 hosts: 1.7 s of SQLite's single
// writer) lets other writes in between its batches.
const staleBatch = 500

// MarkStale implements store.Store, staleBatch hosts to a transaction;
// on an error it returns the hosts the committed batches marked. In each,
// the hosts are read and locked first, then written one by one with what
// mark says: a replica that races this one waits for the locks and then
// finds the hosts stale, so a host is reported by exactly one of them.
// Every host a batch reads leaves the condition (marked, or last seen
// after cutoff), so the next batch reads others.
func (s *Store) MarkStale(ctx context.Context, cutoff time.Time,
	mark func(id string, lastSeen time.Time) store.StaleMark) ([]string, error) {
	var stale []string
	for {
		marked, found, err := s.markStaleBatch(ctx, cutoff, mark)
		stale = append(stale, marked...)
		if err != nil {
			return stale, fmt.Errorf("mark stale: %w", err)
		}
		if found < staleBatch {
			return stale, nil
		}
	}
}

// markStaleBatch is one MarkStale transaction: the hosts it marked, and
// how many it read.
func (s *Store) markStaleBatch(ctx context.Context, cutoff time.Time,
	mark func(id string, lastSeen time.Time) store.StaleMark) (stale []string, found int, err error) {
	// Every status a heartbeating host can have goes stale when heartbeats stop.
	// A revoked host is never heartbeating: it stays auth_failed.
	// An api_unreachable host a preflight run named stays so.
	const cond = `(status IN ('healthy', 'task_result_failed') OR (status = 'api_unreachable' AND status_reason NOT LIKE $2))
		AND revoked = 0 AND last_seen_at > 0 AND last_seen_at < $1`
	err = s.db.InTx(ctx, func(tx DB) error {
		stale = stale[:0]
		type seen struct {
			id   string
			last int64
		}
		rows, err := collect(func(r Row) (seen, error) {
			var v seen
			return v, r.Scan(&v.id, &v.last)
		})(tx.Query(ctx, `SELECT id, last_seen_at FROM hosts WHERE `+cond+` ORDER BY id LIMIT $3`+s.d.ForUpdate,
			ms(cutoff), store.PreflightStatusReasonPrefix+"%", staleBatch))
		if err != nil {
			return err
		}
		found = len(rows)
		now := ms(s.now())
		var audits []store.AuditEvent
		for _, h := range rows {
			var m store.StaleMark
			if mark != nil {
				m = mark(h.id, tm(h.last))
			}
			if m.HeardAt.After(cutoff) {
				if _, err := tx.Exec(ctx, `UPDATE hosts SET last_seen_at = $2 WHERE id = $1 AND last_seen_at < $2`,
					h.id, ms(m.HeardAt)); err != nil {
					return err
				}
				continue
			}
			q, args := `UPDATE hosts SET status = 'stale', updated_at = $2 WHERE id = $1`, []any{h.id, now}
			if f := m.Failure; f.Signal != "" {
				q = `UPDATE hosts SET status = 'stale', updated_at = $2, last_failure_signal = $3, last_failure_detail = $4,
					last_failure_correlation_id = $5, last_failure_at = $6 WHERE id = $1`
				args = append(args, f.Signal, f.Detail, f.CorrelationID, ms(f.At))
			}
			if _, err := tx.Exec(ctx, q, args...); err != nil {
				return err
			}
			if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventHost, ID: h.id}); err != nil {
				return fmt.Errorf("notify: %w", err)
			}
			if m.Audit.Action != "" {
				audits = append(audits, m.Audit)
			}
			stale = append(stale, h.id)
		}
		return s.appendAuditsTx(ctx, tx, audits)
	})
	if err != nil {
		return nil, 0, err
	}
	return stale, found, nil
}

// collect returns a function that reads every row of a query with scan and
// closes the rows. It takes the query's two results as they are, so a
// caller writes collect(scanX)(db.Query(ctx, q, args...)).
func collect[T any](scan func(Row) (T, error)) func(Rows, error) ([]T, error) {
	return func(rows Rows, err error) ([]T, error) {
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []T
		for rows.Next() {
			v, err := scan(rows)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, rows.Err()
	}
}

// collectStrings reads a one-column result of strings and closes rows.
func collectStrings(rows Rows) ([]string, error) { return collectColumn[string](rows) }

// collectInts reads a one-column result of integers and closes rows.
func collectInts(rows Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	return collectColumn[int64](rows)
}

func collectColumn[T any](rows Rows) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// notFound maps ErrNoRows to store.ErrNotFound and wraps err with context.
func notFound(err error, format string, args ...any) error {
	if errors.Is(err, ErrNoRows) {
		err = store.ErrNotFound
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}
