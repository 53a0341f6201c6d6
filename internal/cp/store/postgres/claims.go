package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// claimBatchSQL claims, in one statement, the oldest claimable tasks of
// each node of a group: for each row of the request unnest the lateral
// SELECT picks that node's r_max oldest queued, unexpired tasks that no other
// transaction holds (FOR UPDATE SKIP LOCKED), unless the node's host is
// disabled or revoked, read in the same statement as in sqlstore's single
// claim, so a claim never follows a committed disable. The lease is the
// request's lease for the task's type (ClaimLeases.ByType, flattened into
// $4..$6), else its default. A node appears at most once per group
// (taskBatcher), so no two rows pick the same task. The picked rows are
// locked and were queued when locked (a row updated meanwhile is re-checked
// before it is locked), so the update does not test the state again:
// without table statistics (a fresh queue) the planner would read every
// queued task through the state index for that test; the redundant
// "id = ANY(...)" has it read the picked rows through the primary key.
const claimBatchSQL = `WITH r AS (
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $7::bigint[])
			WITH ORDINALITY AS r(r_node, r_now, r_default, r_max, r_ord)
	), pick AS (
		SELECT r_ord, r_now, r_default, c_id FROM r CROSS JOIN LATERAL (
			SELECT id AS c_id FROM tasks WHERE node_id = r_node AND state = 'queued' AND expires_at > r_now
			ORDER BY created_at, id LIMIT r_max FOR UPDATE SKIP LOCKED) c
		WHERE NOT EXISTS (SELECT 1 FROM hosts WHERE hosts.id = r_node AND (hosts.enabled = 0 OR hosts.revoked = 1))
	)
	UPDATE tasks SET state = 'dispatched', dispatched_at = r_now, attempts = attempts + 1,
		lease_expires_at = COALESCE((SELECT l_lease FROM unnest($4::bigint[], $5::text[], $6::bigint[])
			AS l(l_ord, l_type, l_lease) WHERE l_ord = r_ord AND l_type = tasks.type LIMIT 1), r_default)
	FROM pick WHERE id = c_id AND id = ANY(ARRAY(SELECT c_id FROM pick))
	RETURNING r_ord, ` + sqlstore.TaskCols

// claimsStmt is claimBatchSQL for reqs, all claims of distinct nodes.
func claimsStmt(reqs []*taskReq) stmt {
	n := len(reqs)
	nodes, nows, leases := make([]string, n), make([]int64, n), make([]int64, n)
	maxes, limits := make([]int64, n), make([]int, n)
	var lords, lvals []int64
	var types []string
	for i, r := range reqs {
		nodes[i], nows[i], leases[i] = r.nodeID, r.now, r.lease
		limits[i] = max(r.max, 1)
		maxes[i] = int64(limits[i])
		for typ, at := range r.byType {
			lords, types, lvals = append(lords, int64(i+1)), append(types, typ), append(lvals, unixMs(at))
		}
	}
	return stmt{sql: claimBatchSQL, args: []any{nodes, nows, leases, lords, types, lvals, maxes}, n: n, max: limits}
}

// unixMs is sqlstore's time encoding: Unix milliseconds, 0 for the zero
// time.
func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// ClaimTask implements store.Store: ClaimTaskLeases with one lease.
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

// ClaimTasks implements store.Store like sqlstore's, with the claims of
// several nodes group-committed (taskBatcher): each claim is still bound
// to its node, takes up to max of that node's oldest claimable tasks and
// is answered only after the commit that holds them. A second claim of a
// node in one group claims alone after the group (sqlstore's single path).
func (s *Store) ClaimTasks(ctx context.Context, nodeID string, now time.Time, leases store.ClaimLeases, max int,
	audit func([]store.Task) []store.AuditEvent) ([]store.Task, error) {
	r := &taskReq{claim: true, nodeID: nodeID, now: unixMs(now), lease: unixMs(leases.Default), byType: leases.ByType, max: max,
		audit: audit}
	if err := s.batch.do(ctx, r); err != nil {
		return nil, fmt.Errorf("claim task for %q: %w", nodeID, err)
	}
	if r.skipped {
		return s.Store.ClaimTasks(ctx, nodeID, now, leases, max, audit)
	}
	return r.tasks, nil
}
