// Package logfile reads a plain log file as a runtime.LogReader stream:
// every line prefixed with a stream name ("serial "), the last Tail lines
// found by reading backwards in bounded chunks, and Follow as tail -f by
// polling (no inotify, so it works on every OS the agent builds for),
// starting over when the file is truncated or replaced (a restarted VM's
// fresh serial log). It holds one read buffer per open reader.
//
// The file has no per-line times, so Since is applied by the file's
// modification time only: a file not written since Since yields no past
// lines (only new ones with Follow); otherwise Since keeps every line.
package logfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// DefaultPoll is how often a followed file is checked for new bytes.
const DefaultPoll = 250 * time.Millisecond

// chunk is the read buffer (and the backwards scan step for Tail).
const chunk = 32 << 10

// Options of Open.
type Options struct {
	runtime.LogOptions
	// Prefix is the record's stream name ("serial").
	Prefix string
	// Poll is the Follow polling period (DefaultPoll when zero).
	Poll time.Duration
}

// Open opens path and returns its reader; it ends with ctx or Close.
func Open(ctx context.Context, path string, o Options) (io.ReadCloser, error) {
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat log %s: %w", path, err)
	}
	start := int64(0)
	switch {
	case !o.Since.IsZero() && st.ModTime().Before(o.Since):
		start = st.Size()
	case o.Tail > 0:
		if start, err = tailOffset(f, st.Size(), o.Tail); err != nil {
			f.Close()
			return nil, err
		}
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("seek log %s: %w", path, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	r := &reader{pr: pr, cancel: cancel}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := &tailer{path: path, f: f, off: start, o: o, w: pw, atStart: true}
		defer func() { t.f.Close() }()
		pw.CloseWithError(t.run(ctx))
	}()
	// Close the pipe when ctx ends so a pending Read returns.
	context.AfterFunc(ctx, func() { pr.CloseWithError(io.EOF) })
	return r, nil
}

type reader struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (r *reader) Read(p []byte) (int, error) { return r.pr.Read(p) }

// Close stops the tailer and waits for it to let go of the file.
func (r *reader) Close() error {
	r.cancel()
	r.pr.CloseWithError(io.EOF)
	r.wg.Wait()
	return nil
}

// tailOffset is the offset of the start of the last n lines of f (size
// bytes); a final line without a newline counts as a line.
func tailOffset(f *os.File, size int64, n int) (int64, error) {
	buf := make([]byte, chunk)
	pos := size
	seen := 0
	first := true
	for pos > 0 {
		step := int64(len(buf))
		if pos < step {
			step = pos
		}
		pos -= step
		b := buf[:step]
		if _, err := f.ReadAt(b, pos); err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("read log tail: %w", err)
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != '\n' {
				continue
			}
			if first && pos+int64(i) == size-1 {
				continue // the last line's own newline
			}
			if seen++; seen == n {
				return pos + int64(i) + 1, nil
			}
		}
		first = false
	}
	return 0, nil
}

// tailer copies the file to w with every line prefixed.
type tailer struct {
	path    string
	f       *os.File
	off     int64
	o       Options
	w       io.Writer
	atStart bool
}

func (t *tailer) run(ctx context.Context) error {
	buf := make([]byte, chunk)
	for {
		n, err := t.f.Read(buf)
		if n > 0 {
			t.off += int64(n)
			if werr := t.emit(buf[:n]); werr != nil {
				return werr
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read log %s: %w", t.path, err)
		}
		if !t.o.Follow {
			return io.EOF
		}
		select {
		case <-ctx.Done():
			return io.EOF
		case <-time.After(t.o.Poll):
		}
		if err := t.reopenIfReplaced(); err != nil {
			return err
		}
	}
}

// reopenIfReplaced starts over when the file shrank (truncated) or the
// path now names another file (replaced by a restart).
func (t *tailer) reopenIfReplaced() error {
	cur, err := t.f.Stat()
	if err != nil {
		return fmt.Errorf("stat log %s: %w", t.path, err)
	}
	byPath, err := os.Stat(t.path)
	if err == nil && !os.SameFile(cur, byPath) {
		nf, err := os.Open(t.path)
		if err != nil {
			return nil // replaced but not readable yet: keep polling
		}
		t.f.Close()
		t.f, t.off = nf, 0
		return t.restartLine()
	}
	if cur.Size() < t.off {
		if _, err := t.f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("seek log %s: %w", t.path, err)
		}
		t.off = 0
		return t.restartLine()
	}
	return nil
}

// restartLine ends a line left open before the file started over.
func (t *tailer) restartLine() error {
	if t.atStart {
		return nil
	}
	t.atStart = true
	_, err := t.w.Write([]byte{'\n'})
	return err
}

// emit writes b, prefixing every line start.
func (t *tailer) emit(b []byte) error {
	prefix := []byte(t.o.Prefix + " ")
	out := make([]byte, 0, len(b)+len(prefix)*4)
	for len(b) > 0 {
		if t.atStart {
			out = append(out, prefix...)
			t.atStart = false
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			out = append(out, b...)
			break
		}
		out = append(out, b[:i+1]...)
		b = b[i+1:]
		t.atStart = true
	}
	_, err := t.w.Write(out)
	return err
}
