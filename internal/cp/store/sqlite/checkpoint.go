package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// checkpointInterval is how often the checkpointer copies the WAL's
// committed pages into the database file, when something was committed.
const checkpointInterval = time.Second

// writerCheckpointPages is the writer's own auto-checkpoint threshold
// (wal_autocheckpoint, in pages): a backstop that only a checkpointer
// falling far behind leaves it to reach (40 MB of WAL at 4 KiB pages).
// SQLite's default, 1000 pages, ran a checkpoint inside one group commit
// in every few, on the single writer: ≈ 14 % of the writer's time at 2,500
// tasks/s (docs/performance.md, "Task throughput, fourth pass").
const writerCheckpointPages = 10000

// walSizeLimit bounds the WAL file once a checkpoint has let it restart
// (journal_size_limit): a burst that grew it past this is truncated back.
const walSizeLimit = 64 << 20

// checkpointer runs PASSIVE checkpoints on a connection of its own, so
// that copying the WAL into the database file (and the fsyncs that go with
// it) runs beside the group writer instead of inside its commits. PASSIVE
// never waits for the writer or for readers: it copies what no reader
// still needs and leaves the rest to the next run. It runs only when the
// writer has committed since the last run, so an idle store costs nothing.
//
// The WAL's pages reach the disk (fsync) at each checkpoint: with
// synchronous=NORMAL a power loss can roll back what was committed since
// the last one, now at most about checkpointInterval ago under any load.
type checkpointer struct {
	db      *sql.DB
	every   time.Duration
	commits *atomic.Uint64 // the group writer's commits so far
	covered atomic.Uint64  // commits that the last checkpoint run covered
	runs    atomic.Uint64  // checkpoints run (tests)
	log     *slog.Logger
	// failed counts the runs failed in a row (the run goroutine's own).
	failed int
	quit   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// newCheckpointer opens the checkpoint connection to the database at name
// (a file: URI without parameters) and starts checkpointing every every.
func newCheckpointer(ctx context.Context, name string, every time.Duration, commits *atomic.Uint64,
	log *slog.Logger) (*checkpointer, error) {
	db, err := sql.Open("sqlite", name+"?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	c := &checkpointer{db: db, every: every, commits: commits, log: log, quit: make(chan struct{})}
	c.wg.Add(1)
	go c.run()
	return c, nil
}

func (c *checkpointer) run() {
	defer c.wg.Done()
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-t.C:
		}
		n := c.commits.Load()
		if n == c.covered.Load() {
			continue
		}
		// A failed run is tried again at the next tick; meanwhile the
		// writer's own backstop bounds the WAL.
		err := c.checkpoint()
		c.report(err)
		if err == nil {
			c.covered.Store(n)
			c.runs.Add(1)
		}
	}
}

// report logs the first failure of a run of them, and the recovery after
// it: failing checkpoints leave the WAL to grow to the writer's backstop,
// and widen what a power loss can roll back from a second to that.
func (c *checkpointer) report(err error) {
	switch {
	case err != nil:
		c.failed++
		if c.failed == 1 {
			c.log.Warn("sqlite checkpoints failing; retried each interval, the WAL grows until they work again",
				"err", err, "wal_backstop_pages", writerCheckpointPages)
		}
	case c.failed > 0:
		c.log.Info("sqlite checkpoints work again", "failed_runs", c.failed)
		c.failed = 0
	}
}

// checkpoint runs one PASSIVE checkpoint.
func (c *checkpointer) checkpoint() error {
	var busy, frames, copied int
	if err := c.db.QueryRow(`PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &copied); err != nil {
		return fmt.Errorf("sqlite: checkpoint: %w", err)
	}
	return nil
}

// close stops the checkpointer and closes its connection.
func (c *checkpointer) close() error {
	c.once.Do(func() { close(c.quit) })
	c.wg.Wait()
	return c.db.Close()
}
