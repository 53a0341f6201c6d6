package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/migrations"
	"github.com/drover-dev/drover/internal/cp/store/postgres"
	"github.com/drover-dev/drover/internal/cp/store/storetest"
	"github.com/drover-dev/drover/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	srv := pgtest.Default(t)
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, srv.NewDatabase(t)) })
}

// TestEventsCrossStores: Subscribe on one Store receives the events caused
// through another Store on the same database, as between replicas.
func TestEventsCrossStores(t *testing.T) {
	dsn := pgtest.Default(t).NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := a.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.EnqueueTask(ctx, store.Task{ID: "t1", NodeID: "node:1", Type: "x",
		CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	wait(t, ch, store.Event{Kind: store.EventTask, ID: "node:1"})
	if err := b.CreateHost(ctx, store.Host{ID: "h1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.UpdateHost(ctx, "h1", func(h *store.Host) error { h.Enabled = false; return nil }); err != nil {
		t.Fatal(err)
	}
	wait(t, ch, store.Event{Kind: store.EventHost, ID: "h1"})

	// Requeues by a reaper on B wake waiters on A.
	if _, ok, err := b.ClaimTask(ctx, "node:1", time.Now(), time.Now().Add(-time.Second)); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if _, _, err := b.ReapTasks(ctx, time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	wait(t, ch, store.Event{Kind: store.EventTask, ID: "node:1"})
}

// TestListenerReconnects: the LISTEN connection is killed; the listener
// reconnects, publishes EventResync (what was committed in between is
// lost) and delivery resumes.
func TestListenerReconnects(t *testing.T) {
	dsn := pgtest.Default(t).NewDatabase(t)
	s := open(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if up, n := s.ListenStats(); !up || n != 0 {
		t.Fatalf("ListenStats before the kill = %v, %d; want true, 0", up, n)
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var killed int
	if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d LISTEN backends, want 1", killed)
	}
	// The resync is published once the new connection listens, so the
	// next notification is delivered.
	wait(t, ch, store.Event{Kind: store.EventResync})
	if up, n := s.ListenStats(); !up || n != 1 {
		t.Fatalf("ListenStats after the reconnect = %v, %d; want true, 1", up, n)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_notify('`+postgres.Channel+`', 'host:probe')`); err != nil {
		t.Fatal(err)
	}
	wait(t, ch, store.Event{Kind: store.EventHost, ID: "probe"})
}

// TestClaimAcrossStores: two replicas drain one queue; no task twice.
func TestClaimAcrossStores(t *testing.T) {
	dsn := pgtest.Default(t).NewDatabase(t)
	stores := []*postgres.Store{open(t, dsn), open(t, dsn)}
	ctx := context.Background()
	now := time.Now()
	const n = 200
	for i := range n {
		if err := stores[0].EnqueueTask(ctx, store.Task{ID: time.Duration(i).String(), NodeID: "n1", Type: "x",
			CreatedAt: now.Add(time.Duration(i) * time.Millisecond), ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		wg      sync.WaitGroup
	)
	for w := range 8 {
		s := stores[w%2]
		wg.Go(func() {
			for {
				task, ok, err := s.ClaimTask(ctx, "n1", now, now.Add(time.Minute))
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					return
				}
				mu.Lock()
				claimed[task.ID]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(claimed) != n {
		t.Fatalf("%d tasks claimed, want %d", len(claimed), n)
	}
	for id, c := range claimed {
		if c != 1 {
			t.Errorf("task %s claimed %d times", id, c)
		}
	}
}

// TestConcurrentOpen: replicas starting together migrate once, without
// racing on the schema.
func TestConcurrentOpen(t *testing.T) {
	dsn := pgtest.Default(t).NewDatabase(t)
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			s, err := postgres.Open(context.Background(), dsn)
			if err != nil {
				t.Error(err)
				return
			}
			s.Close()
		})
	}
	wg.Wait()
}

// TestMigrationsDownUp: the Down section undoes the schema completely.
func TestMigrationsDownUp(t *testing.T) {
	dsn := pgtest.Default(t).NewDatabase(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	ctx := context.Background()
	if err := migrations.Up(ctx, db, goose.DialectPostgres); err != nil {
		t.Fatal(err)
	}
	p, err := migrations.NewProvider(db, goose.DialectPostgres)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	var tables int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables
		WHERE table_schema = 'public' AND table_name <> 'goose_db_version'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d tables left after down", tables)
	}
	if err := migrations.Up(ctx, db, goose.DialectPostgres); err != nil {
		t.Fatal(err)
	}
}

// TestOperatorRolesMigration runs migration 00005 over pre-existing tokens
// (duplicate names among them).
func TestOperatorRolesMigration(t *testing.T) {
	cfg, err := pgx.ParseConfig(pgtest.Default(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	storetest.MigrateOperatorRoles(t, db, goose.DialectPostgres)
}

func wait(t *testing.T, ch <-chan store.Event, want store.Event) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("subscription closed")
			}
			if ev == want {
				return
			}
		case <-timeout:
			t.Fatalf("no event %+v", want)
		}
	}
}
