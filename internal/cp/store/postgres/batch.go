package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// maxBatch bounds the requests one group commit serves.
const maxBatch = 256

// maxGather bounds how long a group waits for more requests.
const maxGather = time.Millisecond

// taskReq is one claim (ClaimTaskLeases) or one result (CompleteTask)
// waiting for its group commit.
type taskReq struct {
	ctx  context.Context
	done chan struct{} // closed once the request is answered
	err  error         // the group failed, or ctx ended before it ran

	claim  bool
	nodeID string
	// A claim's times (Unix ms), its leases by task type and the most
	// tasks it takes (0 is one).
	now, lease int64
	byType     map[string]time.Time
	max        int
	// A result.
	taskID, state, result, hash string
	at                          int64

	// audit (nil: none) gives the records of what the request claimed or
	// applied, written in the group's transaction (ClaimTasks' and
	// CompleteTask's audit).
	audit func([]store.Task) []store.AuditEvent

	skipped bool         // left out of the group: the caller runs the single path
	ok      bool         // a task was claimed, or the result applied
	tasks   []store.Task // the claimed tasks (oldest first) or the updated one, when ok
	task    store.Task   // tasks[0], when ok
}

// taskBatcher is PostgreSQL's group commit of task claims and results.
// One goroutine takes the requests waiting when it is free (at most
// maxBatch) and serves them with at most two statements, the results'
// completeBatchSQL and the claims' claimBatchSQL, sent together as one
// pgx batch: one round trip and one implicit transaction, so one commit
// and one WAL flush for the whole group. Every request is answered only
// after that commit, as with one statement per request. If either
// statement or the commit fails, the transaction is rolled back as a whole
// and every request of the group gets the error: nothing of it is applied,
// so a retry applies each request once. A deadlock or serialisation
// failure is retried (maxTxAttempts). A group with audit records runs in
// an explicit transaction instead, in two round trips (execAudited).
//
// What a statement does not serve is answered "skipped" and its caller
// runs sqlstore's single path after the commit: a request alone in its
// group while only one node is active (nothing to share; the single
// statement is cheaper to plan), a second claim of a node
// already in the group (two picks of one node in one statement would pick
// the same task) and a second result for a task already in the group
// (the single path then sees the first one committed: a replay returns
// the task, another result is a conflict).
//
// A group starts with the requests waiting when the goroutine is free. If
// fewer have come than the distinct nodes of the last two groups, it waits
// for the others up to half the last group's time (at most maxGather):
// the callers of one group come back together, and without the wait the
// first one back would start a group alone while the rest queue behind it,
// splitting the callers into groups that each wait for the other's commit.
// A lone caller (one node in the last two groups) does not wait.
//
// The statements run with neither the callers' cancellation nor their
// deadlines (one caller giving up must not roll back the others); a
// request whose context ended before its group started is answered with
// that error and not run.
type taskBatcher struct {
	pool *pgxpool.Pool
	// auditColumns is records as auditBatchSQL's arguments, under new ids
	// (sqlstore's AuditColumns).
	auditColumns func(es []store.AuditEvent) []any
	reqs         chan *taskReq
	quit         chan struct{}
	wg           sync.WaitGroup
	once         sync.Once
	// alone: the last two groups held at most one node (run's goroutine
	// only).
	alone bool
}

func newTaskBatcher(pool *pgxpool.Pool, auditColumns func([]store.AuditEvent) []any) *taskBatcher {
	b := &taskBatcher{pool: pool, auditColumns: auditColumns, reqs: make(chan *taskReq), quit: make(chan struct{})}
	b.wg.Add(1)
	go b.run()
	return b
}

// do submits r and waits until its group is answered.
func (b *taskBatcher) do(ctx context.Context, r *taskReq) error {
	r.ctx, r.done = ctx, make(chan struct{})
	select {
	case b.reqs <- r:
	case <-b.quit:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	<-r.done // answered after the commit even if ctx ends meanwhile
	return r.err
}

// close stops the goroutine once the group in progress is answered;
// requests submitted afterwards get errClosed.
func (b *taskBatcher) close() {
	b.once.Do(func() { close(b.quit) })
	b.wg.Wait()
}

func (b *taskBatcher) run() {
	defer b.wg.Done()
	batch := make([]*taskReq, 0, maxBatch)
	var (
		recent, last map[string]bool // nodes of the last two groups
		lastDur      time.Duration   // how long the last group took
		timer        = time.NewTimer(time.Hour)
	)
	timer.Stop()
	for {
		select {
		case <-b.quit:
			return
		case r := <-b.reqs:
			batch = append(batch[:0], r)
		}
	more:
		for len(batch) < maxBatch {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
			default:
				break more
			}
		}
		// Gather: wait a little for the nodes of the last two groups that
		// have not asked yet, up to half the last group's time.
		if want := expected(recent, last); len(batch) < want && lastDur > 0 {
			timer.Reset(min(lastDur/2, maxGather))
		gather:
			for len(batch) < want && len(batch) < maxBatch {
				select {
				case r := <-b.reqs:
					batch = append(batch, r)
				case <-timer.C:
					break gather
				}
			}
			timer.Stop()
		}
		b.alone = expected(recent, last) <= 1
		t0 := time.Now()
		b.flush(batch)
		lastDur = time.Since(t0)
		recent, last = last, make(map[string]bool, len(batch))
		for _, r := range batch {
			last[r.nodeID] = true
			close(r.done)
		}
		clear(batch)
	}
}

// expected is the number of distinct nodes in a and b.
func expected(a, b map[string]bool) int {
	n := len(a)
	for k := range b {
		if !a[k] {
			n++
		}
	}
	return n
}

// flush runs batch's group and sets each request's outcome; run answers
// them.
func (b *taskBatcher) flush(batch []*taskReq) {
	var claims, results []*taskReq
	nodes := make(map[string]bool)
	tasks := make(map[string]bool)
	for _, r := range batch {
		switch {
		case r.ctx.Err() != nil:
			r.err = r.ctx.Err()
		case r.claim && nodes[r.nodeID], !r.claim && tasks[r.taskID]:
			r.skipped = true
		case r.claim:
			nodes[r.nodeID] = true
			claims = append(claims, r)
		default:
			tasks[r.taskID] = true
			results = append(results, r)
		}
	}
	if len(claims)+len(results) == 1 && b.alone {
		// One node at a time: sqlstore's single statement, prepared once
		// and planned generically, costs PostgreSQL less than a group
		// statement's planning; the caller runs it. (A straggler of a
		// busier time stays in the group flow: run alone, its commit would
		// compete with the next group's.)
		for _, r := range append(claims, results...) {
			r.skipped = true
		}
		return
	}
	var groups [][]*taskReq
	var stmts []stmt
	if len(results) > 0 {
		groups, stmts = append(groups, results), append(stmts, resultsStmt(results))
	}
	if len(claims) > 0 {
		groups, stmts = append(groups, claims), append(stmts, claimsStmt(claims))
	}
	if len(stmts) == 0 {
		return
	}
	var (
		out [][][]store.Task
		err error
	)
	records := func(out [][][]store.Task) []store.AuditEvent {
		var es []store.AuditEvent
		for i, g := range groups {
			for j, r := range g {
				if r.audit != nil && len(out[i][j]) > 0 {
					es = append(es, r.audit(out[i][j])...)
				}
			}
		}
		return es
	}
	audited := slices.ContainsFunc(batch, func(r *taskReq) bool { return r.audit != nil && !r.skipped && r.err == nil })
	for range maxTxAttempts {
		if audited {
			out, err = b.execAudited(stmts, records)
		} else {
			out, err = b.exec(stmts)
		}
		if err == nil || !isRetryable(err) && !errors.Is(err, errAuditIDTaken) {
			break
		}
	}
	for i, g := range groups {
		for j, r := range g {
			if err != nil {
				r.err = fmt.Errorf("group commit: %w", err)
				continue
			}
			r.tasks = out[i][j]
			if r.ok = len(r.tasks) > 0; r.ok {
				r.task = r.tasks[0]
			}
		}
	}
}

// stmt is one statement of a group: its SQL, arguments and the number of
// requests it serves (its rows' ordinals run from 1 to n), with the most
// rows each may get (nil: one each).
type stmt struct {
	sql  string
	args []any
	n    int
	max  []int
}

// rowsOf is the most rows request i may get.
func (s stmt) rowsOf(i int) int {
	if s.max == nil {
		return 1
	}
	return s.max[i]
}

// exec runs stmts in one round trip and one implicit transaction and
// returns, per statement, each request's rows. Nothing is returned unless
// every statement and the commit succeeded.
func (b *taskBatcher) exec(stmts []stmt) ([][][]store.Task, error) {
	ctx := context.Background()
	out := make([][][]store.Task, len(stmts))
	if len(stmts) == 1 {
		rows, err := b.pool.Query(ctx, stmts[0].sql, stmts[0].args...)
		if err != nil {
			return nil, err
		}
		if out[0], err = collectRows(rows, stmts[0]); err != nil {
			return nil, err
		}
		return out, nil
	}
	// The batch's end is the implicit transaction's: a failed commit is
	// reported by sendGroup.
	return sendGroup(ctx, b.pool, false, stmts)
}

// sendGroup sends stmts as one pgx batch on q, after a BEGIN when begin
// is set, and returns, per statement, each request's rows; nothing unless
// every statement (and the batch's end) succeeded.
func sendGroup(ctx context.Context, q interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, begin bool, stmts []stmt) ([][][]store.Task, error) {
	out := make([][][]store.Task, len(stmts))
	var pb pgx.Batch
	if begin {
		pb.Queue("BEGIN")
	}
	for _, s := range stmts {
		pb.Queue(s.sql, s.args...)
	}
	br := q.SendBatch(ctx, &pb)
	if begin {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	for i, s := range stmts {
		rows, err := br.Query()
		if err == nil {
			out[i], err = collectRows(rows, s)
		}
		if err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	return out, nil
}

// auditBatchSQL writes a group's records, given as sqlstore's
// AuditColumns, in one statement whose text (and so its prepared
// statement) does not depend on their number. It is a plain INSERT: an id
// another replica's clock already gave a record aborts the transaction,
// and the group runs again under new ids (errAuditIDTaken).
const auditBatchSQL = `INSERT INTO audit (id, at, actor, actor_token_id, actor_role, action, target, result, correlation_id, detail)
	SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[])`

// errAuditIDTaken: a group's record collided with an existing record's
// id; flush runs the group again.
var errAuditIDTaken = errors.New("an audit record id is taken")

// execAudited is exec in an explicit transaction that also writes the
// audit records of the rows (records) before its commit: a request's
// change and its records are committed together or not at all. It costs
// one round trip more than exec: BEGIN goes with the group's statements,
// the records with the COMMIT. (Written after the group, each request's
// records would have cost a commit of their own.) On any failure the
// transaction is rolled back.
func (b *taskBatcher) execAudited(stmts []stmt, records func([][][]store.Task) []store.AuditEvent) ([][][]store.Task, error) {
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	committed := false
	defer func() {
		if !committed && conn.Conn().PgConn().TxStatus() != 'I' {
			// A connection left in a transaction is closed by Release.
			_, _ = conn.Exec(ctx, "ROLLBACK")
		}
	}()
	out, err := sendGroup(ctx, conn, true, stmts)
	if err != nil {
		return nil, err
	}
	var pb pgx.Batch
	es := records(out)
	if len(es) > 0 {
		pb.Queue(auditBatchSQL, b.auditColumns(es)...)
	}
	pb.Queue("COMMIT")
	br := conn.SendBatch(ctx, &pb)
	if len(es) > 0 {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			if isUniqueViolation(err) {
				err = fmt.Errorf("%w: %w", errAuditIDTaken, err)
			}
			return nil, fmt.Errorf("audit: %w", err)
		}
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	committed = true
	return out, nil
}

// collectRows reads a group statement's rows, (ordinal, task columns), for
// its s.n requests, at most s.max[i] rows for request i+1 (one where max is
// nil), the tasks of a request oldest first, and closes rows.
func collectRows(rows pgx.Rows, s stmt) ([][]store.Task, error) {
	defer rows.Close()
	out := make([][]store.Task, s.n)
	for rows.Next() {
		var ord int64
		t, err := sqlstore.ScanTask(ordRow{rows: rows, ord: &ord})
		if err != nil {
			return nil, err
		}
		if ord < 1 || ord > int64(s.n) || len(out[ord-1]) >= s.rowsOf(int(ord-1)) {
			return nil, fmt.Errorf("group statement returned too many rows for request %d of %d", ord, s.n)
		}
		out[ord-1] = append(out[ord-1], t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, ts := range out {
		slices.SortFunc(ts, sqlstore.OldestFirst)
	}
	return out, nil
}

// ordRow scans a group statement's ordinal before the task columns.
type ordRow struct {
	rows interface{ Scan(dest ...any) error }
	ord  *int64
}

func (o ordRow) Scan(dest ...any) error {
	return o.rows.Scan(append([]any{o.ord}, dest...)...)
}
