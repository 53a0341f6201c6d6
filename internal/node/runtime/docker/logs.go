package docker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

var _ runtime.LogReader = (*Runtime)(nil)

// maxLogLine bounds one record's line: a longer line is split into
// records of at most this many bytes (each ended with a newline), so a
// reader holds at most about this much per stream.
const maxLogLine = 1 << 20

// Logs reads an instance's container log from the engine (its log driver;
// the default json-file keeps per-line times): stdout and stderr,
// demultiplexed, one "stdout"/"stderr" record per line. Only a container
// this adapter made (named drover-<id> and labelled with the id) is read;
// any other id wraps runtime.ErrNotFound. Since and Tail are exact: the
// engine applies each alone; with both (the engine would take the last
// Tail lines of the whole log, then those since Since) the adapter reads
// the lines from Since up to now twice, counting, then skipping all but
// the last Tail, and follows from just after now. Follow keeps reading
// new lines until ctx ends or Close, which cancels the engine request.
func (r *Runtime) Logs(ctx context.Context, id string, opts runtime.LogOptions) (io.ReadCloser, error) {
	if !runtime.ValidID(id) {
		return nil, notFound("logs", id)
	}
	ins, err := r.inspect(ctx, "logs", id)
	if err != nil {
		return nil, err
	}
	if ins.Config == nil || ins.Config.Labels[LabelInstance] != id {
		return nil, notFound("logs", id)
	}
	tty := ins.Config.Tty
	ctx, cancel := context.WithCancel(ctx)
	lr := &logReader{cancel: cancel, done: make(chan struct{})}
	var pw *io.PipeWriter
	lr.pr, pw = io.Pipe()

	base := client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true}
	since := opts.Since
	if since.Unix() <= 0 {
		since = time.Time{}
	}
	if since.IsZero() || opts.Tail <= 0 {
		// The engine applies either alone exactly.
		o := base
		o.Follow = opts.Follow
		o.Since = engineTimestamp(since)
		o.Tail = "all"
		if opts.Tail > 0 {
			o.Tail = strconv.Itoa(opts.Tail)
		}
		body, err := r.openLogs(ctx, id, ins.ID, o)
		if err != nil {
			cancel()
			return nil, err
		}
		go lr.run(ctx, pw, func() error {
			return copyLog(body, tty, func(rec []byte) error { _, err := pw.Write(rec); return err })
		})
	} else {
		now := time.Now()
		past := base
		past.Since, past.Until = engineTimestamp(since), engineTimestamp(now)
		// Count first, so that the second read of the same lines can
		// skip all but the last Tail without holding them.
		body, err := r.openLogs(ctx, id, ins.ID, past)
		if err != nil {
			cancel()
			return nil, err
		}
		go lr.run(ctx, pw, func() error {
			n := 0
			if err := copyLog(body, tty, func([]byte) error { n++; return nil }); err != nil {
				return err
			}
			skip := n - opts.Tail
			if err := r.copyLogs(ctx, id, ins.ID, tty, past, func(rec []byte) error {
				if skip > 0 {
					skip--
					return nil
				}
				_, err := pw.Write(rec)
				return err
			}); err != nil || !opts.Follow {
				return err
			}
			next := base
			next.Follow, next.Since = true, engineTimestamp(now.Add(time.Nanosecond))
			return r.copyLogs(ctx, id, ins.ID, tty, next, func(rec []byte) error { _, err := pw.Write(rec); return err })
		})
	}
	context.AfterFunc(ctx, func() { lr.pr.CloseWithError(io.EOF) })
	return lr, nil
}

// openLogs asks the engine for a container's log.
func (r *Runtime) openLogs(ctx context.Context, id, cid string, o client.ContainerLogsOptions) (io.ReadCloser, error) {
	body, err := r.cli.ContainerLogs(ctx, cid, o)
	if isNotFound(err) {
		return nil, notFound("logs", id)
	}
	if err != nil {
		return nil, r.fail(api.ReasonContainerStartFailed, "logs", id, fmt.Errorf("read the container log: %w", err))
	}
	return body, nil
}

// copyLogs opens a container's log and copies it as records to emit.
func (r *Runtime) copyLogs(ctx context.Context, id, cid string, tty bool, o client.ContainerLogsOptions, emit func([]byte) error) error {
	body, err := r.openLogs(ctx, id, cid, o)
	if err != nil {
		return err
	}
	return copyLog(body, tty, emit)
}

// engineTimestamp is t as the engine's "seconds.nanoseconds" (""
// for the zero time).
func engineTimestamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond())
}

// copyLog demultiplexes body (a TTY's log is one raw stream, stdout) into
// records passed to emit, and closes body.
func copyLog(body io.ReadCloser, tty bool, emit func([]byte) error) error {
	defer body.Close()
	out := &lineWriter{stream: runtime.LogStdout, emit: emit}
	errw := &lineWriter{stream: runtime.LogStderr, emit: emit}
	var err error
	if tty {
		_, err = io.Copy(out, body)
	} else {
		_, err = stdcopy.StdCopy(out, errw, body)
	}
	if err != nil {
		return err
	}
	if err := out.flush(); err != nil {
		return err
	}
	return errw.flush()
}

// lineWriter buffers one stream's bytes and emits a "<stream> <line>\n"
// record per line; a line over maxLogLine is split.
type lineWriter struct {
	stream string
	emit   func([]byte) error
	buf    []byte
	rec    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		room := maxLogLine - len(w.buf)
		chunk := p
		if len(chunk) > room {
			chunk = chunk[:room]
		}
		if i := bytes.IndexByte(chunk, '\n'); i >= 0 {
			w.buf = append(w.buf, chunk[:i]...)
			p = p[i+1:]
			if err := w.line(); err != nil {
				return 0, err
			}
			continue
		}
		w.buf = append(w.buf, chunk...)
		p = p[len(chunk):]
		if len(w.buf) >= maxLogLine {
			if err := w.line(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// flush emits a line not ended yet as a record, with a newline (the two
// streams' records interleave).
func (w *lineWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	return w.line()
}

// line emits what is buffered (possibly nothing: an empty line) as one
// record.
func (w *lineWriter) line() error {
	w.rec = append(append(append(append(w.rec[:0], w.stream...), ' '), w.buf...), '\n')
	w.buf = w.buf[:0]
	return w.emit(w.rec)
}

// logReader is the reader Logs returns: a pipe fed by one goroutine.
type logReader struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// run feeds pw with copy's records, then ends the pipe: io.EOF at the
// end of the log or once ctx ended (Close, the caller), copy's error
// otherwise.
func (lr *logReader) run(ctx context.Context, pw *io.PipeWriter, copy func() error) {
	defer close(lr.done)
	err := copy()
	if err == nil || ctx.Err() != nil {
		err = io.EOF
	}
	pw.CloseWithError(err)
}

func (lr *logReader) Read(p []byte) (int, error) { return lr.pr.Read(p) }

// Close cancels the engine request and waits for the copier; it may be
// called more than once and concurrently with Read.
func (lr *logReader) Close() error {
	lr.once.Do(func() {
		lr.cancel()
		lr.pr.CloseWithError(io.EOF)
	})
	<-lr.done
	return nil
}
