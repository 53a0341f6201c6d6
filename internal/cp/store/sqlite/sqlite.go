// Package sqlite owns the SQLite adapter of store.Store (modernc.org/sqlite,
// no cgo): opening the database file in WAL mode, running the embedded
// migrations, routing statements to one writer connection or a pool of
// read-only connections, checkpointing the WAL beside the writer, and
// in-process change notifications published after each commit. It is
// meant for a single control-plane process (`drover dev`, small
// installs); events do not cross processes.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/migrations"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// Store is a store.Store over one SQLite database file.
type Store struct {
	*sqlstore.Store
	writer *sql.DB
	reader *sql.DB // == writer for an in-memory database
	db     *poolDB
	hub    *sqlstore.Broadcaster
	ckpt   *checkpointer // nil for an in-memory database
}

var _ store.Store = (*Store)(nil)

// MemoryPath opens a private in-memory database (one connection, so reads
// queue behind writes); useful for tests.
const MemoryPath = ":memory:"

// Open opens (creating if needed, mode 0600) the SQLite database file at
// path, or a private in-memory database for MemoryPath, and applies pending
// migrations.
//
// Writes go through a single connection (database/sql pool of size one) whose
// transactions begin IMMEDIATE, owned by one writer goroutine that commits
// the writes waiting for it together (group commit, each write in its own
// savepoint, every caller answered after the commit; see groupWriter), so
// writers within the process queue in Go instead of spinning in SQLite's
// busy handler; busy_timeout(5000) covers other processes. Statements are
// prepared once per connection (stmtCache). Statements that start with SELECT run on a separate pool
// of query_only connections, which WAL lets proceed while a write is in
// progress. A file database's WAL is copied into the database file by a
// checkpointer on a connection of its own, beside the writer rather than
// inside its commits (see checkpointer).
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	o := options{log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	return open(ctx, path, checkpointInterval, o.log)
}

// Option configures Open.
type Option func(*options)

type options struct{ log *slog.Logger }

// WithLogger has the store log what it does on its own, beside the
// callers' writes (a checkpointer that fails, and recovers).
func WithLogger(log *slog.Logger) Option { return func(o *options) { o.log = log } }

// open is Open with the checkpointer's interval and logger.
func open(ctx context.Context, path string, checkpointEvery time.Duration, log *slog.Logger) (*Store, error) {
	if path == "" {
		return nil, errors.New("sqlite: empty path")
	}
	mem := path == MemoryPath
	name := "file:" + escapePath(path)
	if mem {
		name = "file::memory:"
	} else if err := createPrivate(path); err != nil {
		return nil, fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	writer, err := sql.Open("sqlite", name+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"+
		"&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate"+
		fmt.Sprintf("&_pragma=wal_autocheckpoint(%d)&_pragma=journal_size_limit(%d)", writerCheckpointPages, walSizeLimit))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)
	if err := writer.PingContext(ctx); err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if err := migrations.Up(ctx, writer, goose.DialectSQLite3); err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: %s: %w", path, err)
	}
	reader := writer
	if !mem {
		reader, err = sql.Open("sqlite", name+"?_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_query_only=1")
		if err != nil {
			writer.Close()
			return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
		}
		n := max(4, runtime.GOMAXPROCS(0))
		reader.SetMaxOpenConns(n)
		reader.SetMaxIdleConns(n)
		if err := reader.PingContext(ctx); err != nil {
			reader.Close()
			writer.Close()
			return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
		}
	}
	hub := sqlstore.NewBroadcaster()
	db := newPoolDB(writer, reader, hub)
	var ckpt *checkpointer
	if !mem {
		if ckpt, err = newCheckpointer(ctx, name, checkpointEvery, &db.g.commits, log.With("sqlite", path)); err != nil {
			db.close()
			reader.Close()
			writer.Close()
			return nil, fmt.Errorf("sqlite: open %s: checkpoint connection: %w", path, err)
		}
	}
	s := &Store{
		Store: sqlstore.New(db, sqlstore.Dialect{
			Name:              "sqlite",
			ClaimIndex:        " INDEXED BY tasks_node_state_created",
			PeekClaim:         true,
			TouchHosts:        touchHosts,
			Notify:            db.notify,
			IsUniqueViolation: isUniqueViolation,
			StatementRollback: true,
		}),
		writer: writer,
		reader: reader,
		db:     db,
		hub:    hub,
		ckpt:   ckpt,
	}
	return s, nil
}

// createPrivate creates the database file readable by its owner only, since
// it holds the CA key and the task-signing keys; SQLite gives its -wal and
// -shm files the same mode. An existing file is left alone.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

// escapePath makes path safe inside a file: URI.
func escapePath(path string) string {
	return strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
}

// Subscribe implements store.Store: events of this process's commits only.
func (s *Store) Subscribe(ctx context.Context) (<-chan store.Event, error) {
	return s.hub.Subscribe(ctx), nil
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.writer.PingContext(ctx); err != nil {
		return fmt.Errorf("sqlite: ping: %w", err)
	}
	if err := s.reader.PingContext(ctx); err != nil {
		return fmt.Errorf("sqlite: ping: %w", err)
	}
	return nil
}

// Close implements store.Store: subscriptions end and connections close.
func (s *Store) Close() error {
	s.hub.Close()
	errs := []error{s.db.close()}
	if s.ckpt != nil {
		errs = append(errs, s.ckpt.close())
	}
	if s.reader != s.writer {
		errs = append(errs, s.reader.Close())
	}
	errs = append(errs, s.writer.Close())
	return errors.Join(errs...)
}

func isUniqueViolation(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return true
	}
	return false
}
