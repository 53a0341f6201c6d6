package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover-dev/drover/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestNewDatabase(t *testing.T) {
	srv := pgtest.Default(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := srv.NewDatabase(t), srv.NewDatabase(t)
	if a == b {
		t.Fatalf("two tests share database %s", a)
	}
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var version string
	var fsync string
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num'), current_setting('fsync')`).Scan(&version, &fsync); err != nil {
		t.Fatal(err)
	}
	if fsync != "off" {
		t.Errorf("fsync = %s, want off", fsync)
	}
	t.Logf("server_version_num %s, dsn %s", version, a)
}

// TestStartStop starts a second, private server and stops it.
func TestStartStop(t *testing.T) {
	srv, err := pgtest.StartServer()
	if err != nil {
		pgtest.Skip(t, err)
	}
	dsn := srv.DSN("postgres")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	srv.Stop()
	srv.Stop() // idempotent
	if conn, err := pgx.Connect(ctx, dsn); err == nil {
		conn.Close(ctx)
		t.Fatal("server still accepts connections after Stop")
	}
}

// TestHaltResume: a server halted (fast shutdown) or crashed (immediate
// shutdown) refuses connections and keeps its committed data; resumed, it
// answers on the same DSN.
func TestHaltResume(t *testing.T) {
	srv, err := pgtest.StartServer()
	if err != nil {
		pgtest.Skip(t, err)
	}
	t.Cleanup(srv.Stop)
	for _, tc := range []struct {
		name string
		stop func() error
	}{
		{"halt", srv.Halt},
		{"crash", srv.Crash},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			ctx := context.Background()
			exec := func() error {
				conn, err := pgx.Connect(ctx, dsn)
				if err != nil {
					return err
				}
				defer conn.Close(ctx)
				// The test server commits asynchronously; this commit is
				// flushed before it returns, so a crash keeps it.
				_, err = conn.Exec(ctx, `SET synchronous_commit = on; CREATE TABLE IF NOT EXISTS kept (id int); INSERT INTO kept VALUES (1)`)
				return err
			}
			if err := exec(); err != nil {
				t.Fatal(err)
			}
			if err := tc.stop(); err != nil {
				t.Fatal(err)
			}
			if err := exec(); err == nil {
				t.Fatal("a stopped server accepted a connection")
			}
			if err := srv.Resume(); err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM kept`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("after Resume: %d rows, %v", n, err)
			}
		})
	}
}

// TestSkip: outside CI, missing PostgreSQL skips. Checked in a child
// process, so that the suite itself has no skipped test (scripts/test fails
// a CI run on any skip).
func TestSkip(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		pgtest.Skip(t, fmt.Errorf("wrapped: %w", pgtest.ErrNoPostgres))
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSkip$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD=1", "CI=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- SKIP: TestSkip") {
		t.Fatalf("missing binaries should skip outside CI (err %v):\n%s", err, out)
	}
}

// TestSkipFailsInCI: with CI=true missing PostgreSQL is a failure. Checked in
// a child process, since the failure is the point.
func TestSkipFailsInCI(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		pgtest.Skip(t, pgtest.ErrNoPostgres)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSkipFailsInCI$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD=1", "CI=true")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--- FAIL: TestSkipFailsInCI") {
		t.Fatalf("child did not fail (err %v):\n%s", err, out)
	}
}

func TestMissingBinaries(t *testing.T) {
	t.Setenv("DROVER_PG_BIN", t.TempDir())
	_, err := pgtest.StartServer()
	if !errors.Is(err, pgtest.ErrNoPostgres) {
		t.Fatalf("err = %v, want ErrNoPostgres", err)
	}
}
