package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/postgres"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// claimBenchWorkers is the default number of concurrent claimers, one node
// each, as parked agents are; DROVER_BENCH_CLAIMERS overrides it.
const claimBenchWorkers = 8

// claimers is DROVER_BENCH_CLAIMERS, else claimBenchWorkers.
func claimers(b *testing.B) int {
	v := os.Getenv("DROVER_BENCH_CLAIMERS")
	if v == "" {
		return claimBenchWorkers
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("DROVER_BENCH_CLAIMERS=%q: want a positive number", v)
	}
	return n
}

// BenchmarkClaimResult compares, on one PostgreSQL server of its own started
// with fsync, synchronous_commit and full_page_writes on (pgtest's shared
// server runs with them off), a raw task queue loop — one
// UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING to
// claim and one UPDATE to post the result, each its own commit — with the
// store's ClaimTaskLeases + CompleteTask on an identical schema and queue.
// Each sub-benchmark queues b.N tasks over the claimers' nodes
// (claimBenchWorkers, or DROVER_BENCH_CLAIMERS) and times draining them;
// both use the same pool size (pgxpool's default). Run with a fixed count,
// e.g.
//
//	go test ./internal/cp/store/postgres -run '^$' -bench ClaimResult -benchtime 4000x -count 3
//
// and compare the tasks/s metrics of raw and store within one run. The
// shared disk's fsync time drifts by several times within seconds, so
// DROVER_BENCH_ROUNDS=k runs raw, store, raw, store, ... k times each on the
// same server, for ratios of adjacent pairs. With
// DROVER_BENCH_PG_DSN (a superuser URL of a running server whose fsync
// and synchronous_commit are on) it runs there instead, so that the same
// server can then serve `drover bench fleet --store`.
func BenchmarkClaimResult(b *testing.B) {
	ctx := context.Background()
	newDB := func(b *testing.B) string { return externalDatabase(ctx, b, os.Getenv("DROVER_BENCH_PG_DSN")) }
	if os.Getenv("DROVER_BENCH_PG_DSN") == "" {
		srv, err := pgtest.StartServerWith("fsync=on", "synchronous_commit=on", "full_page_writes=on")
		if err != nil {
			pgtest.Skip(b, err)
		}
		defer srv.Stop()
		newDB = func(b *testing.B) string { return srv.NewDatabase(b) }
	}
	rounds := 1
	if v := os.Getenv("DROVER_BENCH_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("DROVER_BENCH_ROUNDS=%q: want a positive number", v)
		}
		rounds = n
	}
	for range rounds {
		for _, mode := range benchModes() {
			benchClaimMode(ctx, b, mode, newDB)
		}
	}
}

// benchModes is DROVER_BENCH_MODES (comma-separated), else raw and
// store. The modes: raw (the textbook loop), store (the store's claim and
// result without audit records), audit-after (each with its record
// written after it, as the tasks room did before its records went into the
// claim's and the result's transaction) and audit-tx (the records in
// them, as the tasks room writes them now).
func benchModes() []string {
	if v := os.Getenv("DROVER_BENCH_MODES"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"raw", "store"}
}

// benchClaimMode is one sub-benchmark of BenchmarkClaimResult: a mode of
// benchModes on a fresh database of newDB.
func benchClaimMode(ctx context.Context, b *testing.B, mode string, newDB func(*testing.B) string) {
	b.Run(mode, func(b *testing.B) {
		dsn := newDB(b)
		s, err := postgres.Open(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		var sc string
		if err := pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit') || '/' || current_setting('fsync')`).Scan(&sc); err != nil || sc != "on/on" {
			b.Fatalf("synchronous_commit/fsync = %q, %v; want on/on", sc, err)
		}
		workers := claimers(b)
		seedClaimBench(ctx, b, s, b.N, workers)
		var claim func(ctx context.Context, pool *pgxpool.Pool, node string) (bool, error)
		switch mode {
		case "raw":
			claim = rawClaim
		case "store", "audit-after", "audit-tx":
			claim = storeClaim(s, mode)
		default:
			b.Fatalf("unknown mode %q", mode)
		}
		b.ResetTimer()
		var wg sync.WaitGroup
		done := make([]int, workers)
		for w := range workers {
			wg.Go(func() {
				node := fmt.Sprintf("n%d", w)
				for {
					ok, err := claim(ctx, pool, node)
					if err != nil {
						b.Error(err)
						return
					}
					if !ok {
						return
					}
					done[w]++
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		total := 0
		for _, d := range done {
			total += d
		}
		if total != b.N {
			b.Fatalf("%d tasks done, want %d", total, b.N)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
	})
}

// externalDatabase creates a database on the server of admin (a URL whose
// path is a database), drops it when b ends and returns its URL.
func externalDatabase(ctx context.Context, b *testing.B, admin string) string {
	b.Helper()
	u, err := url.Parse(admin)
	if err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("claimbench_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if c, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = c.Exec(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`)
			_ = c.Close(ctx)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// seedClaimBench queues n tasks round-robin over the nodes of the workers,
// with their hosts (the store's claim reads the host's flags).
func seedClaimBench(ctx context.Context, b *testing.B, s *postgres.Store, n, workers int) {
	b.Helper()
	for w := range workers {
		if err := s.CreateHost(ctx, store.Host{ID: fmt.Sprintf("n%d", w), Enabled: true}); err != nil {
			b.Fatal(err)
		}
	}
	now := time.Now()
	batch := make([]store.Task, 0, 500)
	for i := range n {
		batch = append(batch, store.Task{ID: fmt.Sprintf("t%07d", i), NodeID: fmt.Sprintf("n%d", i%workers),
			Type: "diag.health_probe", Params: json.RawMessage(`{}`), CreatedAt: now.Add(time.Duration(i)),
			ExpiresAt: now.Add(time.Hour)})
		if len(batch) == cap(batch) || i == n-1 {
			if err := s.InsertTasks(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

var benchResult = json.RawMessage(`{"status":"succeeded","finished_at":"2026-01-01T00:00:00Z"}`)

// rawClaim is the textbook SKIP LOCKED queue: claim, then the result, two
// autocommitted statements on the pool.
func rawClaim(ctx context.Context, pool *pgxpool.Pool, node string) (bool, error) {
	now := time.Now().UnixMilli()
	var id string
	err := pool.QueryRow(ctx, `UPDATE tasks SET state = 'dispatched', dispatched_at = $2, lease_expires_at = $3,
		attempts = attempts + 1
		WHERE id = (SELECT id FROM tasks WHERE node_id = $1 AND state = 'queued' AND expires_at > $2
			ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id`, node, now, now+60_000).Scan(&id)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = pool.Exec(ctx, `UPDATE tasks SET state = 'succeeded', result = $2, result_hash = 'h', finished_at = $3,
		lease_expires_at = 0 WHERE id = $1 AND state IN ('queued', 'dispatched', 'running')`,
		id, string(benchResult), time.Now().UnixMilli())
	return err == nil, err
}

// storeClaim is Drover's store path: a claim of one task, then its
// result, with their audit records as mode says (benchModes).
func storeClaim(s *postgres.Store, mode string) func(ctx context.Context, _ *pgxpool.Pool, node string) (bool, error) {
	record := func(action string, t store.Task) store.AuditEvent {
		return store.AuditEvent{Actor: "node:" + t.NodeID, Action: action, Target: t.ID, Result: string(t.State),
			CorrelationID: t.CorrelationID}
	}
	var claimAudit func([]store.Task) []store.AuditEvent
	var resultAudit func(store.Task) []store.AuditEvent
	if mode == "audit-tx" {
		claimAudit = func(ts []store.Task) []store.AuditEvent { return []store.AuditEvent{record("task.claim", ts[0])} }
		resultAudit = func(t store.Task) []store.AuditEvent { return []store.AuditEvent{record("task.result", t)} }
	}
	after := func(ctx context.Context, action string, t store.Task) error {
		if mode != "audit-after" {
			return nil
		}
		return s.AppendAudit(ctx, record(action, t))
	}
	return func(ctx context.Context, _ *pgxpool.Pool, node string) (bool, error) {
		now := time.Now()
		ts, err := s.ClaimTasks(ctx, node, now, store.ClaimLeases{Default: now.Add(time.Minute)}, 1, claimAudit)
		if err != nil || len(ts) == 0 {
			return false, err
		}
		if err := after(ctx, "task.claim", ts[0]); err != nil {
			return false, err
		}
		t, err := s.CompleteTask(ctx, node, ts[0].ID, api.TaskSucceeded, benchResult, "h", time.Now(), resultAudit)
		if err == nil {
			err = after(ctx, "task.result", t)
		}
		return err == nil, err
	}
}
