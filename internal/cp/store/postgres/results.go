package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
	"github.com/drover-dev/drover/internal/wire/api"
)

// completeBatchSQL applies the results of a group in one statement. Each
// row of the unnest is one result, bound to its node exactly as sqlstore's
// single UPDATE is: it is applied only to a task of that node that is not
// finished. The aliases do not clash with the tasks columns, so RETURNING
// reads the updated task as sqlstore.ScanTask expects it. "Not terminal"
// is the single UPDATE's state IN ('queued', 'dispatched', 'running') (the
// column's CHECK allows no other state) written so that no index serves
// it, and the redundant "id = ANY($1)" makes the planner read the tasks
// through the primary key: without table statistics (a fresh queue) it
// would otherwise read every unfinished task through the state index.
// (That plan did not come back on PostgreSQL 15 without it;
// TestResultsStatementUsesPrimaryKey checks the plan either way.)
const completeBatchSQL = `UPDATE tasks SET state = r_state, result = r_result, result_hash = r_hash,
		finished_at = r_at, lease_expires_at = 0
	FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[])
		WITH ORDINALITY AS r(r_id, r_node, r_state, r_result, r_hash, r_at, r_ord)
	WHERE id = r_id AND id = ANY($1::text[]) AND node_id = r_node
		AND state NOT IN ('succeeded', 'failed', 'expired', 'canceled')
	RETURNING r_ord, ` + sqlstore.TaskCols

// resultsStmt is completeBatchSQL for reqs, all results.
func resultsStmt(reqs []*taskReq) stmt {
	n := len(reqs)
	ids, nodes, states := make([]string, n), make([]string, n), make([]string, n)
	results, hashes, ats := make([]string, n), make([]string, n), make([]int64, n)
	for i, r := range reqs {
		ids[i], nodes[i], states[i] = r.taskID, r.nodeID, r.state
		results[i], hashes[i], ats[i] = r.result, r.hash, r.at
	}
	return stmt{sql: completeBatchSQL, args: []any{ids, nodes, states, results, hashes, ats}, n: n}
}

// CompleteTask implements store.Store like sqlstore's, with the accepting
// case group-committed (taskBatcher). A result without a node (an
// operator's) or without a time, or an invalid state, takes the single
// path directly; so does, after its group, a result the group did not
// apply or left out, to be told a replay (the stored task), a conflict or
// not found.
func (s *Store) CompleteTask(ctx context.Context, nodeID, taskID string, state api.TaskState,
	result json.RawMessage, resultHash string, at time.Time, audit func(store.Task) []store.AuditEvent) (store.Task, error) {
	if nodeID == "" || at.IsZero() || (state != api.TaskSucceeded && state != api.TaskFailed) {
		return s.Store.CompleteTask(ctx, nodeID, taskID, state, result, resultHash, at, audit)
	}
	r := &taskReq{nodeID: nodeID, taskID: taskID, state: string(state), result: string(result),
		hash: resultHash, at: at.UnixMilli()}
	if audit != nil {
		r.audit = func(ts []store.Task) []store.AuditEvent { return audit(ts[0]) }
	}
	if err := s.batch.do(ctx, r); err != nil {
		return store.Task{}, fmt.Errorf("complete task %q: %w", taskID, err)
	}
	if r.ok {
		return r.task, nil
	}
	return s.Store.CompleteTask(ctx, nodeID, taskID, state, result, resultHash, at, audit)
}
