package mock

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

var _ runtime.LogReader = (*Runtime)(nil)

// logLine is one record of an instance's log.
type logLine struct {
	at     time.Time
	stream string
	text   string
}

// logBook holds every instance's log lines (in memory: the mock touches no
// files) and wakes followers when one is added. The zero value is ready.
type logBook struct {
	mu      sync.Mutex
	lines   map[string][]logLine
	changed chan struct{} // closed and replaced on every append
	open    atomic.Int64  // readers not yet closed
}

func (b *logBook) notifyLocked() {
	if b.changed != nil {
		close(b.changed)
	}
	b.changed = make(chan struct{})
}

// since returns the lines of id from index i on, and a channel closed
// when more arrive.
func (b *logBook) from(id string, i int) ([]logLine, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	ls := b.lines[id]
	if i > len(ls) {
		i = len(ls)
	}
	return append([]logLine(nil), ls[i:]...), b.changed
}

// AppendLog adds a line (without its newline) to instance id's log on
// stream ("stdout", "stderr"), as the workload would write it; followers
// receive it at once.
func (m *Runtime) AppendLog(id, stream, line string) {
	b := &m.h.logs
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lines == nil {
		b.lines = map[string][]logLine{}
	}
	b.lines[id] = append(b.lines[id], logLine{at: m.h.now(), stream: stream, text: line})
	b.notifyLocked()
}

// OpenLogReaders is the number of readers Logs returned that are not
// closed yet (tests check that a closed client stops the node's reader).
func (m *Runtime) OpenLogReaders() int { return int(m.h.logs.open.Load()) }

// Logs implements runtime.LogReader. The first call for an instance seeds
// its log with two deterministic lines (stdout "mock: instance <id>
// started", stderr "mock: no workload runs in the mock runtime"); further
// lines come from AppendLog. Since filters by the time a line was added.
func (m *Runtime) Logs(ctx context.Context, id string, opts runtime.LogOptions) (io.ReadCloser, error) {
	m.h.record("logs", id)
	m.h.mu.Lock()
	in := m.h.insts[id]
	m.h.mu.Unlock()
	if in == nil {
		return nil, fmt.Errorf("logs %s: %w", id, runtime.ErrNotFound)
	}
	b := &m.h.logs
	b.mu.Lock()
	if b.lines == nil {
		b.lines = map[string][]logLine{}
	}
	if _, ok := b.lines[id]; !ok {
		at := m.h.now()
		b.lines[id] = []logLine{{at, runtime.LogStdout, "mock: instance " + id + " started"},
			{at, runtime.LogStderr, "mock: no workload runs in the mock runtime"}}
	}
	b.mu.Unlock()

	past, _ := b.from(id, 0)
	next := len(past)
	var sel []logLine
	for _, l := range past {
		if opts.Since.IsZero() || !l.at.Before(opts.Since) {
			sel = append(sel, l)
		}
	}
	if opts.Tail > 0 && len(sel) > opts.Tail {
		sel = sel[len(sel)-opts.Tail:]
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	b.open.Add(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer b.open.Add(-1)
		pw.CloseWithError(followBook(ctx, b, id, next, sel, opts.Follow, pw))
	}()
	context.AfterFunc(ctx, func() { pr.CloseWithError(io.EOF) })
	return &bookReader{pr: pr, cancel: cancel, done: done}, nil
}

// followBook writes lines, then (with follow) every new line of id.
func followBook(ctx context.Context, b *logBook, id string, next int, lines []logLine, follow bool, w io.Writer) error {
	for {
		for _, l := range lines {
			if _, err := fmt.Fprintf(w, "%s %s\n", l.stream, l.text); err != nil {
				return err
			}
		}
		if !follow {
			return io.EOF
		}
		var changed <-chan struct{}
		lines, changed = b.from(id, next)
		next += len(lines)
		if len(lines) > 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return io.EOF
		case <-changed:
		}
	}
}

type bookReader struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *bookReader) Read(p []byte) (int, error) { return r.pr.Read(p) }

// Close stops the follower and waits for it.
func (r *bookReader) Close() error {
	r.cancel()
	r.pr.CloseWithError(io.EOF)
	<-r.done
	return nil
}
