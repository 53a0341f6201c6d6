package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

const taskCols = `id, node_id, type, params, state, correlation_id, created_by, attempts,
	created_at, expires_at, dispatched_at, lease_expires_at, finished_at, result, result_hash`

func scanTask(r Row) (store.Task, error) {
	var (
		t                                               store.Task
		params, state, result                           string
		attempts, created, expires, disp, lease, finish int64
	)
	if err := r.Scan(&t.ID, &t.NodeID, &t.Type, &params, &state, &t.CorrelationID, &t.CreatedBy, &attempts,
		&created, &expires, &disp, &lease, &finish, &result, &t.ResultHash); err != nil {
		return store.Task{}, err
	}
	t.Params, t.Result = textRaw(params), textRaw(result)
	t.State = api.TaskState(state)
	t.Attempts = int(attempts)
	t.CreatedAt, t.ExpiresAt, t.DispatchedAt = tm(created), tm(expires), tm(disp)
	t.LeaseExpiresAt, t.FinishedAt = tm(lease), tm(finish)
	return t, nil
}

// TaskCols is the task column list ScanTask reads, for an adapter's own
// task statements (the PostgreSQL result batch).
const TaskCols = taskCols

// ScanTask reads one row of TaskCols.
func ScanTask(r Row) (store.Task, error) { return scanTask(r) }

func collectTasks(rows Rows, err error) ([]store.Task, error) { return collect(scanTask)(rows, err) }

// EnqueueTask implements store.Store. The task is stored queued with no
// attempts, dispatch, lease, finish or result whatever t says; a zero
// CreatedAt is now. ExpiresAt is required: a task without one could never be
// claimed (claims need expires_at > now).
func (s *Store) EnqueueTask(ctx context.Context, t store.Task, audit ...store.AuditEvent) error {
	return s.InsertTasks(ctx, []store.Task{t}, audit...)
}

// InsertTasks implements store.Store: one transaction, one prepared INSERT
// per task, the audit records, then one EventTask per node. Each task is
// checked as EnqueueTask checks it before anything is written.
func (s *Store) InsertTasks(ctx context.Context, ts []store.Task, audit ...store.AuditEvent) error {
	now := s.now()
	for i := range ts {
		t := &ts[i]
		switch {
		case t.ID == "":
			return errors.New("enqueue task: empty id")
		case t.NodeID == "":
			return fmt.Errorf("enqueue task %q: empty node id", t.ID)
		case t.ExpiresAt.IsZero():
			return fmt.Errorf("enqueue task %q: zero expires_at", t.ID)
		}
	}
	return s.db.InTx(ctx, func(tx DB) error {
		var nodes []string
		for _, t := range ts {
			created := t.CreatedAt
			if created.IsZero() {
				created = now
			}
			_, err := tx.Exec(ctx, `INSERT INTO tasks (id, node_id, type, params, state, correlation_id, created_by,
			attempts, created_at, expires_at, dispatched_at, lease_expires_at, finished_at, result, result_hash)
			VALUES ($1, $2, $3, $4, 'queued', $5, $6, 0, $7, $8, 0, 0, 0, '', '')`,
				t.ID, t.NodeID, t.Type, rawText(t.Params), t.CorrelationID, t.CreatedBy, ms(created), ms(t.ExpiresAt))
			if err != nil {
				if s.d.IsUniqueViolation(err) {
					return fmt.Errorf("enqueue task %q: %w", t.ID, store.ErrConflict)
				}
				return fmt.Errorf("enqueue task %q: %w", t.ID, err)
			}
			if !slices.Contains(nodes, t.NodeID) {
				nodes = append(nodes, t.NodeID)
			}
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("enqueue tasks: audit: %w", err)
		}
		for _, n := range nodes {
			if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventTask, ID: n}); err != nil {
				return fmt.Errorf("enqueue tasks for %q: notify: %w", n, err)
			}
		}
		return nil
	})
}

// GetTask implements store.Store.
func (s *Store) GetTask(ctx context.Context, id string) (store.Task, error) {
	t, err := scanTask(s.db.QueryRow(ctx, `SELECT `+taskCols+` FROM tasks WHERE id = $1`, id))
	if err != nil {
		return store.Task{}, notFound(err, "get task %q", id)
	}
	return t, nil
}

// ListTasks implements store.Store: newest CreatedAt first, ties by id
// descending.
func (s *Store) ListTasks(ctx context.Context, f store.TaskFilter) ([]store.Task, error) {
	var (
		where []string
		args  []any
	)
	if f.NodeID != "" {
		args = append(args, f.NodeID)
		where = append(where, "node_id = $"+strconv.Itoa(len(args)))
	}
	if f.Type != "" {
		args = append(args, f.Type)
		where = append(where, "type = $"+strconv.Itoa(len(args)))
	}
	if f.State != "" {
		args = append(args, string(f.State))
		where = append(where, "state = $"+strconv.Itoa(len(args)))
	}
	if f.CorrelationID != "" {
		args = append(args, f.CorrelationID)
		where = append(where, "correlation_id = $"+strconv.Itoa(len(args)))
	}
	q := `SELECT ` + taskCols + ` FROM tasks`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, limit(f.Limit))
	q += ` ORDER BY created_at DESC, id DESC LIMIT $` + strconv.Itoa(len(args))
	out, err := collectTasks(s.db.Query(ctx, q, args...))
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return out, nil
}

// ClaimTask implements store.Store with one conditional UPDATE: on
// PostgreSQL the inner SELECT skips rows other claimers hold
// (FOR UPDATE SKIP LOCKED); on SQLite writers are serialised. The host's
// enabled and revoked flags are read in the same statement, so a claim
// never follows a committed disable.
func (s *Store) ClaimTask(ctx context.Context, nodeID string, now, leaseUntil time.Time) (store.Task, bool, error) {
	return s.ClaimTaskLeases(ctx, nodeID, now, store.ClaimLeases{Default: leaseUntil})
}

// ClaimTaskLeases implements store.Store: ClaimTasks for one task.
func (s *Store) ClaimTaskLeases(ctx context.Context, nodeID string, now time.Time, leases store.ClaimLeases) (store.Task, bool, error) {
	ts, err := s.ClaimTasks(ctx, nodeID, now, leases, 1, nil)
	if err != nil || len(ts) == 0 {
		return store.Task{}, false, err
	}
	return ts[0], true, nil
}

// ClaimTasks implements store.Store: ClaimTask's statement for up to max
// tasks, with the lease a CASE on each claimed row's type.
func (s *Store) ClaimTasks(ctx context.Context, nodeID string, now time.Time, leases store.ClaimLeases, max int,
	audit func([]store.Task) []store.AuditEvent) ([]store.Task, error) {
	args := []any{nodeID, ms(now), ms(leases.Default)}
	lease := "$3"
	if len(leases.ByType) > 0 {
		types := make([]string, 0, len(leases.ByType))
		for typ := range leases.ByType {
			types = append(types, typ)
		}
		slices.Sort(types)
		var b strings.Builder
		b.WriteString("CASE type")
		for _, typ := range types {
			args = append(args, typ, ms(leases.ByType[typ]))
			fmt.Fprintf(&b, " WHEN $%d THEN CAST($%d AS BIGINT)", len(args)-1, len(args))
		}
		b.WriteString(" ELSE CAST($3 AS BIGINT) END")
		lease = b.String()
	}
	if s.d.PeekClaim {
		var one int
		err := s.db.QueryRow(ctx, `SELECT 1 FROM tasks`+s.d.ClaimIndex+`
			WHERE node_id = $1 AND state = 'queued' AND expires_at > $2 LIMIT 1`, nodeID, ms(now)).Scan(&one)
		if errors.Is(err, ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("claim task for %q: look for a queued task: %w", nodeID, err)
		}
	}
	q := `UPDATE tasks
		SET state = 'dispatched', dispatched_at = $2, lease_expires_at = ` + lease + `, attempts = attempts + 1
		WHERE id %s
		AND NOT EXISTS (SELECT 1 FROM hosts WHERE hosts.id = $1 AND (hosts.enabled = 0 OR hosts.revoked = 1))
		RETURNING ` + taskCols
	limit := "1"
	if max > 1 {
		args = append(args, int64(max))
		limit = "CAST($" + strconv.Itoa(len(args)) + " AS BIGINT)"
	}
	pick := `SELECT id FROM tasks` + s.d.ClaimIndex + ` WHERE node_id = $1 AND state = 'queued' AND expires_at > $2
			ORDER BY created_at, id LIMIT ` + limit + s.d.SkipLocked
	if max <= 1 {
		// "id = (SELECT ...)", a primary-key lookup, as a single statement
		// (in a transaction with its records when audited).
		one := fmt.Sprintf(q, "= ("+pick+") AND state = 'queued'")
		var t store.Task
		err := s.withAudit(ctx, audit != nil, func(db DB) error {
			var err error
			if t, err = scanTask(db.QueryRow(ctx, one, args...)); err != nil {
				return err
			}
			return s.appendClaimAudit(ctx, db, audit, []store.Task{t})
		})
		if errors.Is(err, ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("claim task for %q: %w", nodeID, err)
		}
		return []store.Task{t}, nil
	}
	// Several: the picked rows are queued when picked, and nothing changes
	// them before this statement updates them (SQLite runs one writer;
	// PostgreSQL's SKIP LOCKED has locked them), so the state is not tested
	// again. With that test SQLite's planner would read every queued task
	// of the fleet through the (state, expires_at) index instead of the
	// picked rows through the primary key.
	many := s.d.ClaimMany
	if many == "" {
		many = "IN (%s)"
	}
	var ts []store.Task
	err := s.db.InTx(ctx, func(tx DB) error {
		var err error
		if ts, err = collectTasks(tx.Query(ctx, fmt.Sprintf(q, fmt.Sprintf(many, pick)), args...)); err != nil {
			return err
		}
		// RETURNING's order is the database's; the node gets its oldest
		// first.
		slices.SortFunc(ts, OldestFirst)
		return s.appendClaimAudit(ctx, tx, audit, ts)
	})
	if err != nil {
		return nil, fmt.Errorf("claim tasks for %q: %w", nodeID, err)
	}
	return ts, nil
}

// withAudit runs fn in a transaction when tx, else on the store as a
// single statement.
func (s *Store) withAudit(ctx context.Context, tx bool, fn func(DB) error) error {
	if !tx {
		return fn(s.db)
	}
	return s.db.InTx(ctx, func(t DB) error { return fn(t) })
}

// appendClaimAudit stores audit's records of the claimed tasks ts in db
// (nothing when audit is nil or nothing was claimed).
func (s *Store) appendClaimAudit(ctx context.Context, db DB, audit func([]store.Task) []store.AuditEvent, ts []store.Task) error {
	if audit == nil || len(ts) == 0 {
		return nil
	}
	if err := s.appendAuditsTx(ctx, db, audit(ts)); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

// OldestFirst orders tasks as a claim takes them: by creation, then id.
func OldestFirst(a, b store.Task) int {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// QueuedTaskNodes implements store.Store (one statement over the
// tasks_state_expires index).
func (s *Store) QueuedTaskNodes(ctx context.Context, now time.Time) ([]string, error) {
	// The hosts are looked up once per node, not once per queued task.
	rows, err := s.db.Query(ctx, `SELECT q.node_id FROM (SELECT DISTINCT node_id FROM tasks
		WHERE state = 'queued' AND expires_at > $1) AS q
		WHERE NOT EXISTS (SELECT 1 FROM hosts WHERE hosts.id = q.node_id AND (hosts.enabled = 0 OR hosts.revoked = 1))`, ms(now))
	if err != nil {
		return nil, fmt.Errorf("queued task nodes: %w", err)
	}
	ids, err := collectStrings(rows)
	if err != nil {
		return nil, fmt.Errorf("queued task nodes: %w", err)
	}
	return ids, nil
}

// lockTask reads a task of nodeID for update. A task of another node is
// ErrNotFound, so nodes cannot probe each other's task ids.
func (s *Store) lockTask(ctx context.Context, tx DB, op, nodeID, taskID string) (store.Task, error) {
	t, err := scanTask(tx.QueryRow(ctx, `SELECT `+taskCols+` FROM tasks WHERE id = $1`+s.d.ForUpdate, taskID))
	if err != nil {
		return store.Task{}, notFound(err, "%s %q", op, taskID)
	}
	if nodeID != "" && t.NodeID != nodeID {
		return store.Task{}, fmt.Errorf("%s %q of node %q: %w", op, taskID, nodeID, store.ErrNotFound)
	}
	return t, nil
}

// StartTask implements store.Store. A queued task is also moved to running:
// it was requeued after its lease ended while the node still ran it, and
// the node proves it holds it; leaving it queued would deliver it twice.
// The lease of a running task is only ever extended.
func (s *Store) StartTask(ctx context.Context, nodeID, taskID string, leaseUntil time.Time) (store.Task, error) {
	var out store.Task
	err := s.db.InTx(ctx, func(tx DB) error {
		t, err := s.lockTask(ctx, tx, "start task", nodeID, taskID)
		if err != nil {
			return err
		}
		if t.State.Terminal() {
			return fmt.Errorf("start task %q: task is %s: %w", taskID, t.State, store.ErrConflict)
		}
		lease := tm(ms(leaseUntil))
		if t.State == api.TaskRunning && t.LeaseExpiresAt.After(lease) {
			lease = t.LeaseExpiresAt
		}
		if _, err := tx.Exec(ctx, `UPDATE tasks SET state = 'running', lease_expires_at = $2 WHERE id = $1`,
			taskID, ms(lease)); err != nil {
			return fmt.Errorf("start task %q: %w", taskID, err)
		}
		t.State, t.LeaseExpiresAt = api.TaskRunning, lease
		out = t
		return nil
	})
	return out, err
}

// CompleteTask implements store.Store. state must be succeeded or failed.
// The result is accepted while the task is queued (requeued after its lease
// ended), dispatched or running. For a task that is already terminal, the
// same non-empty resultHash returns the task unchanged; anything else
// (another result, or a canceled or expired task) is ErrConflict. A zero at
// is now.
//
// The accepting case is one conditional UPDATE ... RETURNING (no
// transaction around a read and a write); only when it matches no row is
// the task read, in a transaction, to tell a replay from a conflict or an
// unknown task. A terminal state is final, so that read cannot race with
// the update.
func (s *Store) CompleteTask(ctx context.Context, nodeID, taskID string, state api.TaskState,
	result json.RawMessage, resultHash string, at time.Time, audit func(store.Task) []store.AuditEvent) (store.Task, error) {
	if state != api.TaskSucceeded && state != api.TaskFailed {
		return store.Task{}, fmt.Errorf("complete task %q: %q is not a result state", taskID, state)
	}
	if at.IsZero() {
		at = s.now()
	}
	args := []any{taskID, string(state), rawText(result), resultHash, ms(at)}
	owner := ""
	if nodeID != "" {
		args, owner = append(args, nodeID), " AND node_id = $6"
	}
	update := `UPDATE tasks SET state = $2, result = $3, result_hash = $4, finished_at = $5, lease_expires_at = 0
		WHERE id = $1` + owner + ` AND state IN ('queued', 'dispatched', 'running')
		RETURNING ` + taskCols
	var t store.Task
	err := s.withAudit(ctx, audit != nil, func(db DB) error {
		var err error
		if t, err = scanTask(db.QueryRow(ctx, update, args...)); err != nil || audit == nil {
			return err
		}
		if err := s.appendAuditsTx(ctx, db, audit(t)); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		return nil
	})
	if err == nil {
		return t, nil
	}
	if !errors.Is(err, ErrNoRows) {
		return store.Task{}, fmt.Errorf("complete task %q: %w", taskID, err)
	}
	// The read that explains the refusal runs as a write would: on SQLite
	// a group commit may hold the write that finished the task, which only
	// the writer sees until it commits.
	err = s.db.InTx(ctx, func(tx DB) error {
		t, err = s.lockTask(ctx, tx, "complete task", nodeID, taskID)
		return err
	})
	switch {
	case err != nil:
		return store.Task{}, err
	case !t.State.Terminal():
		// Not reachable: the update takes every unfinished task.
		return store.Task{}, fmt.Errorf("complete task %q: task is %s: %w", taskID, t.State, store.ErrConflict)
	case t.ResultHash != "" && t.ResultHash == resultHash:
		return t, nil
	}
	return store.Task{}, fmt.Errorf("complete task %q: task is %s with another result: %w", taskID, t.State, store.ErrConflict)
}

// CancelTask implements store.Store. A zero at is now.
func (s *Store) CancelTask(ctx context.Context, id string, at time.Time, audit func(store.Task) []store.AuditEvent) (store.Task, error) {
	if at.IsZero() {
		at = s.now()
	}
	var out store.Task
	err := s.db.InTx(ctx, func(tx DB) error {
		t, err := s.lockTask(ctx, tx, "cancel task", "", id)
		if err != nil {
			return err
		}
		if t.State.Terminal() {
			return fmt.Errorf("cancel task %q: task is %s: %w", id, t.State, store.ErrConflict)
		}
		if _, err := tx.Exec(ctx, `UPDATE tasks SET state = 'canceled', finished_at = $2, lease_expires_at = 0
			WHERE id = $1`, id, ms(at)); err != nil {
			return fmt.Errorf("cancel task %q: %w", id, err)
		}
		t.State, t.FinishedAt, t.LeaseExpiresAt = api.TaskCanceled, tm(ms(at)), time.Time{}
		if audit != nil {
			if err := s.appendAuditsTx(ctx, tx, audit(t)); err != nil {
				return fmt.Errorf("cancel task %q: audit: %w", id, err)
			}
		}
		out = t
		return nil
	})
	return out, err
}

// ReapTasks implements store.Store in one transaction: unfinished tasks with
// expires_at <= now become expired (FinishedAt = now); dispatched or running
// tasks with lease_expires_at < now that have not expired go back to queued
// (Attempts is kept; the next claim increments it) and EventTask is
// published once per affected node. Rows are locked in id order so that
// concurrent reapers on several replicas cannot deadlock. Both slices are
// ordered by CreatedAt, then id.
func (s *Store) ReapTasks(ctx context.Context, now time.Time,
	audit func(requeued, expired []store.Task) []store.AuditEvent) (requeued, expired []store.Task, err error) {
	n := ms(now)
	err = s.db.InTx(ctx, func(tx DB) error {
		const expCond = `state IN ('queued', 'dispatched', 'running') AND expires_at <= $1`
		var err error
		expired, err = collectTasks(tx.Query(ctx, `UPDATE tasks SET state = 'expired', finished_at = $1, lease_expires_at = 0
			WHERE id IN (SELECT id FROM tasks WHERE `+expCond+` ORDER BY id`+s.d.ForUpdate+`) AND `+expCond+`
			RETURNING `+taskCols, n))
		if err != nil {
			return fmt.Errorf("reap tasks: expire: %w", err)
		}
		const leaseCond = `state IN ('dispatched', 'running') AND lease_expires_at < $1 AND expires_at > $1`
		requeued, err = collectTasks(tx.Query(ctx, `UPDATE tasks SET state = 'queued', lease_expires_at = 0
			WHERE id IN (SELECT id FROM tasks WHERE `+leaseCond+` ORDER BY id`+s.d.ForUpdate+`) AND `+leaseCond+`
			RETURNING `+taskCols, n))
		if err != nil {
			return fmt.Errorf("reap tasks: requeue: %w", err)
		}
		nodes := make(map[string]bool)
		for _, t := range requeued {
			if nodes[t.NodeID] {
				continue
			}
			nodes[t.NodeID] = true
			if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventTask, ID: t.NodeID}); err != nil {
				return fmt.Errorf("reap tasks: notify: %w", err)
			}
		}
		sortTasks(requeued)
		sortTasks(expired)
		if audit == nil {
			return nil
		}
		if err := s.appendAuditsTx(ctx, tx, audit(requeued, expired)); err != nil {
			return fmt.Errorf("reap tasks: audit: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return requeued, expired, nil
}

func sortTasks(ts []store.Task) {
	slices.SortFunc(ts, func(a, b store.Task) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// AddTaskEvent implements store.Store. Seq is one more than the task's last
// event; the task row is locked so concurrent appends get distinct numbers.
// ErrNotFound if the task does not exist. A zero At is now.
func (s *Store) AddTaskEvent(ctx context.Context, e store.TaskEvent) error {
	if e.At.IsZero() {
		e.At = s.now()
	}
	return s.db.InTx(ctx, func(tx DB) error {
		var id string
		err := tx.QueryRow(ctx, `SELECT id FROM tasks WHERE id = $1`+s.d.ForUpdate, e.TaskID).Scan(&id)
		if err != nil {
			return notFound(err, "add event to task %q", e.TaskID)
		}
		var seq int64
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM task_events WHERE task_id = $1`,
			e.TaskID).Scan(&seq); err != nil {
			return fmt.Errorf("add event to task %q: %w", e.TaskID, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO task_events (task_id, seq, at, event) VALUES ($1, $2, $3, $4)`,
			e.TaskID, seq+1, ms(e.At), rawText(e.Event)); err != nil {
			return fmt.Errorf("add event to task %q: %w", e.TaskID, err)
		}
		return nil
	})
}

// ListTaskEvents implements store.Store; an unknown task has no events.
func (s *Store) ListTaskEvents(ctx context.Context, taskID string) ([]store.TaskEvent, error) {
	rows, err := s.db.Query(ctx, `SELECT task_id, seq, at, event FROM task_events WHERE task_id = $1 ORDER BY seq`, taskID)
	if err != nil {
		return nil, fmt.Errorf("list events of task %q: %w", taskID, err)
	}
	defer rows.Close()
	var out []store.TaskEvent
	for rows.Next() {
		var (
			e     store.TaskEvent
			at    int64
			event string
		)
		if err := rows.Scan(&e.TaskID, &e.Seq, &at, &event); err != nil {
			return nil, fmt.Errorf("list events of task %q: %w", taskID, err)
		}
		e.At, e.Event = tm(at), textRaw(event)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list events of task %q: %w", taskID, err)
	}
	return out, nil
}
