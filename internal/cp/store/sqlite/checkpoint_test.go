package sqlite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

// TestCheckpointerCopiesWAL: what the writer commits reaches the database
// file through the checkpointer, long before the writer's own threshold
// (writerCheckpointPages), and an idle store runs no checkpoint.
func TestCheckpointerCopiesWAL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "drover.db")
	const every = 20 * time.Millisecond
	s, err := open(ctx, path, every, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	before := size()

	// ≈ 200 KB of audit records, committed in groups: a few hundred pages,
	// far below the writer's own threshold.
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			err := s.AppendAudit(ctx, store.AuditEvent{Actor: "test", Action: "checkpoint.fill",
				Target: fmt.Sprint(i), Detail: strings.Repeat("d", 500)})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for size() < before+200<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("database file %d bytes (%d before the writes) after %d checkpoints: the WAL was not copied into it",
				size(), before, s.ckpt.runs.Load())
		}
		time.Sleep(every)
	}

	// Idle: once a run has covered the last commit, none follows.
	for s.ckpt.covered.Load() != s.db.g.commits.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("the checkpointer covered %d of %d commits", s.ckpt.covered.Load(), s.db.g.commits.Load())
		}
		time.Sleep(every)
	}
	runs := s.ckpt.runs.Load()
	time.Sleep(15 * every)
	if n := s.ckpt.runs.Load(); n != runs {
		t.Fatalf("%d checkpoints while nothing was written", n-runs)
	}
}

// TestCheckpointFailuresLogged: a run of failed checkpoints is logged
// once, with the error, and the recovery once, with the count.
func TestCheckpointFailuresLogged(t *testing.T) {
	var buf bytes.Buffer
	c := &checkpointer{log: slog.New(slog.NewTextHandler(&buf, nil))}
	busy := errors.New("sqlite: checkpoint: database is locked")
	for _, err := range []error{nil, busy, busy, busy, nil, nil, busy} {
		c.report(err)
	}
	out := buf.String()
	if n := strings.Count(out, "sqlite checkpoints failing"); n != 2 {
		t.Errorf("%d failure lines, want one per run of failures (2):\n%s", n, out)
	}
	if !strings.Contains(out, "database is locked") || strings.Count(out, "sqlite checkpoints work again") != 1 ||
		!strings.Contains(out, "failed_runs=3") {
		t.Errorf("log:\n%s", out)
	}
}
