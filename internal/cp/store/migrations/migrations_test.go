package migrations_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite"

	"github.com/drover-dev/drover/internal/cp/store/migrations"
	"github.com/drover-dev/drover/internal/cp/store/storetest"
)

// TestUpDownUpSQLite checks the migrations apply, are idempotent and that
// Down removes everything Up created. The PostgreSQL run of the same files
// is in the postgres package.
func TestUpDownUpSQLite(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "m.db")+"?_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for range 2 {
		if err := migrations.Up(ctx, db, goose.DialectSQLite3); err != nil {
			t.Fatal(err)
		}
	}
	tables := func() int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master
			WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'goose_db_version'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := tables(); n != 19 {
		t.Fatalf("%d tables after up, want 19", n)
	}
	p, err := migrations.NewProvider(db, goose.DialectSQLite3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if n := tables(); n != 0 {
		t.Fatalf("%d tables after down", n)
	}
	if err := migrations.Up(ctx, db, goose.DialectSQLite3); err != nil {
		t.Fatal(err)
	}
}

// TestOperatorRolesSQLite runs migration 00005 over pre-existing tokens
// (duplicate names among them); the PostgreSQL run is in the postgres
// package.
func TestOperatorRolesSQLite(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "m.db")+"?_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	storetest.MigrateOperatorRoles(t, db, goose.DialectSQLite3)
}
