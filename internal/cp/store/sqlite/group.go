package sqlite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// maxGroup bounds the writes one group commit takes.
const maxGroup = 64

// errClosed answers writes submitted after Close.
var errClosed = errors.New("sqlite: store closed")

// groupWriter owns the writer connection for the store's writes and commits
// them in groups: every write (a transaction of InTx, or a single statement
// run outside one) is a job; the writer goroutine takes the jobs waiting
// when it is free (at most maxGroup), runs them one after the other in one
// BEGIN IMMEDIATE transaction, each inside its own SAVEPOINT so that a job
// that fails is rolled back alone, commits once and only then answers every
// job and publishes the events of those that succeeded. A caller is
// therefore answered after its write is committed, exactly as with one
// transaction per write; what a group saves is the commit's WAL write of
// the pages that several writes share (the task and audit tables'
// indexes), one BEGIN and COMMIT per write, and the hand-over of the
// connection between goroutines.
//
// A job's statements run with its context's values but not its
// cancellation: interrupting a statement inside the group's transaction
// would roll back the other jobs' writes as well. A job whose context has
// ended before it starts is answered with that error and not run.
type groupWriter struct {
	p    *poolDB
	jobs chan *job
	quit chan struct{}
	wg   sync.WaitGroup
	once sync.Once
	// commits counts the groups committed (the checkpointer runs only
	// after some).
	commits atomic.Uint64
}

// job is one write.
type job struct {
	ctx     context.Context
	fn      func(tx sqlstore.DB) error
	done    chan struct{}
	err     error
	panicV  any // fn panicked: re-raised in the caller
	panics  bool
	pending []store.Event
}

func newGroupWriter(p *poolDB) *groupWriter {
	g := &groupWriter{p: p, jobs: make(chan *job), quit: make(chan struct{})}
	g.wg.Add(1)
	go g.run()
	return g
}

// do runs fn as a job and waits for its group to commit.
func (g *groupWriter) do(ctx context.Context, fn func(tx sqlstore.DB) error) error {
	j := &job{ctx: ctx, fn: fn, done: make(chan struct{})}
	select {
	case g.jobs <- j:
	case <-g.quit:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	<-j.done // answered after the commit even if ctx ends meanwhile
	if j.panics {
		panic(j.panicV)
	}
	return j.err
}

// close stops the writer goroutine once the group in progress is answered.
func (g *groupWriter) close() {
	g.once.Do(func() { close(g.quit) })
	g.wg.Wait()
}

func (g *groupWriter) run() {
	defer g.wg.Done()
	batch := make([]*job, 0, maxGroup)
	for {
		select {
		case <-g.quit:
			return
		case j := <-g.jobs:
			batch = append(batch[:0], j)
		}
	more:
		for len(batch) < maxGroup {
			select {
			case j := <-g.jobs:
				batch = append(batch, j)
			default:
				break more
			}
		}
		g.commit(batch)
		// Statements first run in this group are prepared before its
		// writes are answered, so a caller's next write finds them.
		g.p.ws.prepareMissed(context.Background())
		for _, j := range batch {
			close(j.done)
		}
		clear(batch)
	}
}

// commit runs batch in one transaction and sets every job's outcome (run
// closes their done channels).
func (g *groupWriter) commit(batch []*job) {
	bg := context.Background()
	tx, err := g.p.w.BeginTx(bg, nil)
	if err != nil {
		for _, j := range batch {
			g.answer(j, err)
		}
		return
	}
	t := &txDB{tx: tx, stmts: g.p.ws}
	savepoints := len(batch) > 1
	var ok []*job
	for i, j := range batch {
		if err := j.ctx.Err(); err != nil {
			g.answer(j, err)
			continue
		}
		if savepoints {
			if _, err := t.Exec(bg, `SAVEPOINT grp`); err != nil {
				g.abort(tx, batch[i:], ok, err)
				return
			}
		}
		t.pending = nil
		if err := g.runJob(j, t); err != nil {
			if !savepoints {
				_ = tx.Rollback()
				g.answer(j, err)
				return
			}
			if _, rerr := t.Exec(bg, `ROLLBACK TO grp`); rerr != nil {
				g.answer(j, err)
				g.abort(tx, batch[i+1:], ok, fmt.Errorf("roll back to savepoint: %w", rerr))
				return
			}
			if _, rerr := t.Exec(bg, `RELEASE grp`); rerr != nil {
				g.answer(j, err)
				g.abort(tx, batch[i+1:], ok, fmt.Errorf("release savepoint: %w", rerr))
				return
			}
			g.answer(j, err)
			continue
		}
		if savepoints {
			if _, err := t.Exec(bg, `RELEASE grp`); err != nil {
				g.abort(tx, batch[i:], ok, fmt.Errorf("release savepoint: %w", err))
				return
			}
		}
		j.pending = t.pending
		ok = append(ok, j)
	}
	if err := tx.Commit(); err != nil {
		for _, j := range ok {
			g.answer(j, err)
		}
		return
	}
	g.commits.Add(1)
	for _, j := range ok {
		for _, ev := range j.pending {
			g.p.hub.Publish(ev)
		}
		g.answer(j, nil)
	}
}

// runJob runs j's fn on t, turning a panic into an error for the group and
// a panic for j's caller.
func (g *groupWriter) runJob(j *job, t *txDB) (err error) {
	defer func() {
		if v := recover(); v != nil {
			j.panics, j.panicV = true, v
			err = fmt.Errorf("sqlite: write panicked: %v", v)
		}
	}()
	return j.fn(t)
}

// abort rolls the group back: the jobs that succeeded (ok) and those not
// run yet (rest) all get err.
func (g *groupWriter) abort(tx interface{ Rollback() error }, rest, ok []*job, err error) {
	_ = tx.Rollback()
	for _, j := range ok {
		j.panics = false
		g.answer(j, err)
	}
	for _, j := range rest {
		g.answer(j, err)
	}
}

// answer sets j's outcome.
func (g *groupWriter) answer(j *job, err error) {
	if err != nil && !j.panics {
		j.err = err
	}
}
