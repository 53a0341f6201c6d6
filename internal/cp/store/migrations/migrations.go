// Package migrations owns Drover's database schema: goose SQL migrations
// embedded in the binary, written once in a portable subset of SQL that both
// SQLite (modernc.org/sqlite) and PostgreSQL accept. See 00001_init.sql for
// the column conventions (TEXT ids, BIGINT unix-millisecond timestamps,
// INTEGER booleans, TEXT JSON, base64 TEXT bytes). Per-dialect migration
// files are deliberately not used: a change that cannot be expressed
// portably belongs in the adapters, not here.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/pressly/goose/v3"
)

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS

// Up applies every pending migration to db. dialect is goose.DialectSQLite3
// or goose.DialectPostgres. Up does not serialise concurrent callers; the
// PostgreSQL adapter wraps it in an advisory lock.
func Up(ctx context.Context, db *sql.DB, dialect goose.Dialect) error {
	p, err := NewProvider(db, dialect)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// NewProvider returns a goose provider over the embedded migrations, for
// callers (tests, tooling) that need Status, Down or versions.
func NewProvider(db *sql.DB, dialect goose.Dialect) (*goose.Provider, error) {
	p, err := goose.NewProvider(dialect, db, FS)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}
