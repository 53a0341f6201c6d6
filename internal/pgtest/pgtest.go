// Package pgtest owns throw-away PostgreSQL servers for tests: it runs
// initdb and postgres from the PostgreSQL binaries (DROVER_PG_BIN, else
// /usr/lib/postgresql/15/bin, else $PATH) in a temporary directory, on
// 127.0.0.1 and a free port, with fsync off. PostgreSQL refuses to run as
// root, so under root the server runs as the "postgres" system user (or
// "nobody"). Each test binary starts its own server, typically from
// TestMain via Main, and hands each test a fresh database.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestX(t *testing.T) {
//		dsn := pgtest.Default(t).NewDatabase(t)
//		...
//	}
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPostgres means the PostgreSQL binaries were not found.
var ErrNoPostgres = errors.New("pgtest: PostgreSQL binaries not found (install PostgreSQL 15 or set DROVER_PG_BIN)")

// DefaultBinDir is where Debian and Ubuntu install PostgreSQL 15.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// superuser is the bootstrap role initdb creates; authentication is trust.
const superuser = "drover"

// Server is a running throw-away PostgreSQL.
type Server struct {
	dir  string // temporary root: data/, sock/, log
	port int
	bin  string     // the PostgreSQL binaries' directory
	user *user.User // the account postgres runs as (nil: the current one)
	cmd  *exec.Cmd
	done chan struct{} // closed when postgres exited
	seq  atomic.Int64
	// settings are extra name=value server settings (StartServerWith),
	// passed after the defaults so they override them.
	settings []string

	stopOnce sync.Once
}

// binDir finds the directory holding initdb and postgres.
func binDir() (string, error) {
	if d := os.Getenv("DROVER_PG_BIN"); d != "" {
		if hasBinaries(d) {
			return d, nil
		}
		return "", fmt.Errorf("%w: DROVER_PG_BIN=%s lacks initdb or postgres", ErrNoPostgres, d)
	}
	if hasBinaries(DefaultBinDir) {
		return DefaultBinDir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil && hasBinaries(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", ErrNoPostgres
}

func hasBinaries(dir string) bool {
	for _, b := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// StartServer initialises and starts a new server. Stop it with Stop.
func StartServer() (*Server, error) { return StartServerWith() }

// StartServerWith is StartServer with extra server settings ("name=value",
// each passed as -c after the defaults, which they override), e.g.
// "fsync=on", "synchronous_commit=on" for a server that flushes its WAL on
// every commit, as a benchmark of commit costs needs.
func StartServerWith(settings ...string) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	var u *user.User
	if os.Geteuid() == 0 {
		if u, err = unprivilegedUser(); err != nil {
			return nil, err
		}
	}
	// Under root the server user must be able to reach the directory, so
	// use /tmp rather than a TMPDIR that may live in root's home.
	parent := ""
	if u != nil {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "drover-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Server{dir: dir, settings: settings}
	if err := s.start(bin, u); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// unprivilegedUser picks the account to run PostgreSQL as under root.
func unprivilegedUser() (*user.User, error) {
	for _, name := range []string{"postgres", "nobody"} {
		if u, err := user.Lookup(name); err == nil {
			return u, nil
		}
	}
	return nil, errors.New("pgtest: running as root and neither user postgres nor nobody exists")
}

func (s *Server) start(bin string, u *user.User) error {
	s.bin, s.user = bin, u
	data, sock, logPath := filepath.Join(s.dir, "data"), filepath.Join(s.dir, "sock"), filepath.Join(s.dir, "postgres.log")
	if err := os.Mkdir(sock, 0o700); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if u != nil {
		if err := chownTree(s.dir, u); err != nil {
			return err
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", superuser,
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Dir = s.dir
	if err := runAs(initdb, u); err != nil {
		return err
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	var lastErr error
	for range 3 { // the free port may be taken before postgres binds it
		port, err := freePort()
		if err != nil {
			return err
		}
		if lastErr = s.launch(bin, u, data, sock, logPath, port); lastErr == nil {
			return nil
		}
	}
	return lastErr
}

func (s *Server) launch(bin string, u *user.User, data, sock, logPath string, port int) error {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	args := []string{"-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-k", sock,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=32MB", "-c", "log_min_messages=warning"}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := runAs(cmd, u); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done, s.port = cmd, done, port

	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			s.cmd, s.done = nil, nil
			return fmt.Errorf("pgtest: postgres exited: %v\n%s", err, tail(logPath))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("pgtest: postgres not ready after 30s: %v\n%s", err, tail(logPath))
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func chownTree(root string, u *user.User) error {
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("pgtest: user %s: %w", u.Username, err)
	}
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		return fmt.Errorf("pgtest: chown %s to %s: %w", root, u.Username, err)
	}
	return nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Port is the TCP port the server listens on (127.0.0.1 only).
func (s *Server) Port() int { return s.port }

// DSN returns a connection URL for database db as the superuser.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", superuser, s.port, db)
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// NewDatabase creates an empty database named after the test and returns
// its DSN. The database is dropped (WITH FORCE) when the test ends; close
// your connections in an earlier-registered Cleanup or defer.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := nonIdent.ReplaceAllString(strings.ToLower(tb.Name()), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("t%d_%s", s.seq.Add(1), name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.admin(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.admin(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
			tb.Logf("pgtest: drop database %s: %v", name, err)
		}
	})
	return s.DSN(name)
}

func (s *Server) admin(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// Stop shuts the server down (fast shutdown, then kill after 10s) and
// removes its directory. It is safe to call more than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			_ = s.cmd.Process.Signal(os.Interrupt) // SIGINT: fast shutdown
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				s.kill()
			}
		}
		_ = os.RemoveAll(s.dir)
	})
}

// Halt stops the server (fast shutdown) and keeps its data, so that Resume
// can start it again: a database outage for tests of the clients'
// recovery. Connections are refused while it is halted.
func (s *Server) Halt() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return errors.New("pgtest: server not running")
	}
	_ = s.cmd.Process.Signal(os.Interrupt) // SIGINT: fast shutdown
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.kill()
		<-s.done
	}
	s.cmd, s.done = nil, nil
	return nil
}

// Crash stops the server as `pg_ctl stop -m immediate` does (SIGQUIT to
// the postmaster: no checkpoint, clients cut off at once; the next start
// runs crash recovery) and keeps its data for Resume.
func (s *Server) Crash() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return errors.New("pgtest: server not running")
	}
	if err := s.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		return fmt.Errorf("pgtest: immediate shutdown: %w", err)
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.kill()
	}
	s.cmd, s.done = nil, nil
	return nil
}

// Resume starts a halted server again on the same port and data, and waits
// until it accepts connections.
func (s *Server) Resume() error {
	if s.cmd != nil {
		return errors.New("pgtest: server already running")
	}
	data, sock, logPath := filepath.Join(s.dir, "data"), filepath.Join(s.dir, "sock"), filepath.Join(s.dir, "postgres.log")
	return s.launch(s.bin, s.user, data, sock, logPath, s.port)
}

func (s *Server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Skip ends tb because the server could not be started: with ErrNoPostgres
// it skips, unless CI=true where missing PostgreSQL is a failure; any other
// error fails.
func Skip(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, ErrNoPostgres) && os.Getenv("CI") != "true" {
		tb.Skipf("skipping: %v", err)
	}
	tb.Fatalf("pgtest: %v", err)
}

var (
	defaultMu  sync.Mutex
	defaultSrv *Server
	defaultErr error
	defaultRun bool
)

// Default returns the test binary's shared server, starting it on first
// use; when it cannot start, Default calls Skip. Call Main from TestMain so
// the server is stopped when the tests end.
func Default(tb testing.TB) *Server {
	tb.Helper()
	defaultMu.Lock()
	if !defaultRun {
		defaultRun = true
		defaultSrv, defaultErr = StartServer()
	}
	srv, err := defaultSrv, defaultErr
	defaultMu.Unlock()
	if err != nil {
		Skip(tb, err)
	}
	return srv
}

// Main runs the tests and then stops the shared server if Default started
// one. Use it as the body of TestMain.
func Main(m *testing.M) {
	code := m.Run()
	defaultMu.Lock()
	if defaultSrv != nil {
		defaultSrv.Stop()
	}
	defaultMu.Unlock()
	if code != 0 {
		os.Exit(code)
	}
}
