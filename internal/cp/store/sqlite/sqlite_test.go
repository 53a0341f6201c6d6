package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/cp/store/storetest"
)

func open(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := sqlite.Open(ctx, path)
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
	storetest.Run(t, func(t *testing.T) store.Store {
		return open(t, filepath.Join(t.TempDir(), "drover.db"))
	})
}

func TestConformanceMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, sqlite.MemoryPath) })
}

// TestDollarPlaceholders pins down what sqlstore relies on: modernc.org/sqlite
// binds $N to the N-th argument, in any order and repeatedly.
func TestDollarPlaceholders(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var a, b, c string
	var n int64
	if err := db.QueryRow(`SELECT $2, $1, $2 || $1, $3`, "x", "y", int64(7)).Scan(&a, &b, &c, &n); err != nil {
		t.Fatal(err)
	}
	if a != "y" || b != "x" || c != "yx" || n != 7 {
		t.Fatalf("got %q %q %q %d", a, b, c, n)
	}
}

// TestReopen: migrations are idempotent and data survives a reopen.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "drover.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateHost(ctx, store.Host{ID: "h1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, path)
	if _, err := s2.GetHost(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
}

// TestWritersAndReaders mixes writers with readers on the separate pools.
func TestWritersAndReaders(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "drover.db"))
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 50 {
				h := store.Host{ID: string(rune('a'+w)) + "-" + time.Duration(i).String()}
				if err := s.CreateHost(ctx, h); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.GetHost(ctx, h.ID); err != nil {
					t.Error(err)
					return
				}
			}
		})
		wg.Go(func() {
			for range 50 {
				if _, err := s.ListHosts(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	hs, err := s.ListHosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 200 {
		t.Fatalf("%d hosts, want 200", len(hs))
	}
}

func TestFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "drover.db")
	s := open(t, path)
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
}
