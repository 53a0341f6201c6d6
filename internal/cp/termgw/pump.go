package termgw

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// codeBrowserGone is the internal outcome "the browser left first"; it is
// not an error and never sent.
const codeBrowserGone terminal.ErrorCode = "browser_closed"

// pump holds one session's two legs and what it buffered before ready.
type pump struct {
	s       *Gateway
	log     *slog.Logger
	sess    store.TerminalSession
	br      *websocket.Conn
	brIn    <-chan frame
	node    *websocket.Conn
	nodeIn  <-chan frame
	started time.Time

	stdin   [][]byte      // keystrokes typed before ready, in order
	stdinN  int           // their total size
	size    terminal.Size // the browser's latest size, held until ready
	resized bool
}

// open waits for the node's stream and its ready frame, sending the browser
// a status frame for every step. It returns "" once the PTY is ready, or
// the code and message the session fails with.
func (p *pump) open(ctx context.Context, l *liveSession, taskID string) (terminal.ErrorCode, string) {
	cfg := p.s.cfg
	dispatch := time.NewTimer(cfg.DispatchTimeout)
	defer dispatch.Stop()
	// Claims and results seen by another replica arrive through the store.
	check := time.NewTicker(time.Second)
	defer check.Stop()
	var streamC, ptyC, noStreamC <-chan time.Time
	dispatched := false
	markDispatched := func() {
		if dispatched {
			return
		}
		dispatched = true
		dispatch.Stop()
		// The browser sees every hop in order, also when the node's stream
		// won the race with the claim's event (both ready in one select):
		// node_connecting then comes right before spawning.
		writeControl(ctx, p.br, terminal.Status(terminal.ProgressDispatched))
		writeControl(ctx, p.br, terminal.Status(terminal.ProgressNodeConnecting))
		if p.node == nil {
			streamC = time.After(cfg.NodeStreamTimeout)
		}
	}
	onTask := func() (terminal.ErrorCode, string) {
		t, err := p.s.store.GetTask(ctx, taskID)
		if err != nil {
			return "", ""
		}
		switch t.State {
		case api.TaskDispatched, api.TaskRunning:
			markDispatched()
		case api.TaskSucceeded:
			markDispatched()
			if p.node == nil && noStreamC == nil {
				// The node says it is connected: a missing stream is now
				// its stale build, not the route (terminal_open_without_stream).
				streamC, noStreamC = nil, time.After(openWithoutStreamGrace)
			}
		case api.TaskFailed:
			return openFailure(t.Result)
		case api.TaskExpired, api.TaskCanceled:
			if !dispatched {
				return p.dispatchFailure(ctx)
			}
		}
		return "", ""
	}
	for {
		var code terminal.ErrorCode
		var msg string
		select {
		case <-ctx.Done():
			return codeBrowserGone, "the gateway is shutting down"
		case <-l.taskCh:
			code, msg = onTask()
		case <-check.C:
			code, msg = onTask()
		case k := <-l.kill:
			return k.code, k.msg
		case <-dispatch.C:
			if code, msg = onTask(); code == "" && !dispatched {
				code, msg = p.dispatchFailure(ctx)
			}
		case <-streamC:
			return terminal.CodeNodeStreamTimeout, fmt.Sprintf(
				"the node picked up terminal.open but its stream did not reach the gateway within %s", cfg.NodeStreamTimeout)
		case <-noStreamC:
			return terminal.CodeOpenWithoutStream,
				"the node reported terminal.open done, but no stream for this session reached the gateway"
		case c := <-l.node:
			p.node, p.nodeIn = c, readFrames(ctx, c)
			streamC, noStreamC = nil, nil
			markDispatched()
			p.s.appendTerminalState(ctx, p.sess.ID, terminal.StateNodeStreamConnected, "", nil)
			writeControl(ctx, p.br, terminal.Status(terminal.ProgressSpawning))
			ptyC = time.After(cfg.PTYTimeout)
		case f := <-p.nodeIn:
			if f.err != nil {
				return p.nodeClosedEarly(ctx, l, onTask)
			}
			if f.ch != terminal.ChanControl {
				return terminal.CodeProtocolError, fmt.Sprintf("the node sent %s before ready", f.ch)
			}
			c, err := terminal.DecodeControl(f.payload)
			if err != nil {
				return terminal.CodeProtocolError, "node: " + err.Error()
			}
			switch c.Type {
			case terminal.TypeReady:
				p.s.appendTerminalState(ctx, p.sess.ID, terminal.StatePTYReady, "", nil)
				return "", ""
			case terminal.TypeError:
				return c.Error, c.Message
			case terminal.TypePing:
				writeControl(ctx, p.node, terminal.Pong())
			}
		case <-ptyC:
			return terminal.CodePTYFailed, fmt.Sprintf("the node's stream connected but the PTY was not ready within %s", cfg.PTYTimeout)
		case f := <-p.brIn:
			code, msg = p.holdBrowser(ctx, f)
		}
		if code != "" {
			return code, msg
		}
	}
}

// holdBrowser handles a browser frame before ready: keystrokes are kept
// (bounded), the latest size is held, pings are answered.
func (p *pump) holdBrowser(ctx context.Context, f frame) (terminal.ErrorCode, string) {
	if f.err != nil {
		if errors.Is(f.err, terminal.ErrProtocol) {
			return terminal.CodeProtocolError, f.err.Error()
		}
		return codeBrowserGone, "the browser closed the terminal"
	}
	switch f.ch {
	case terminal.ChanStdin:
		if p.stdinN+len(f.payload) > maxPendingStdin {
			return terminal.CodeProtocolError, "more than 64 KiB of input before the terminal was ready"
		}
		p.stdin = append(p.stdin, append([]byte(nil), f.payload...))
		p.stdinN += len(f.payload)
	case terminal.ChanResize:
		sz, err := terminal.DecodeResize(f.payload)
		if err != nil {
			return terminal.CodeProtocolError, err.Error()
		}
		p.size, p.resized = sz, true
	case terminal.ChanControl:
		if c, err := terminal.DecodeControl(f.payload); err == nil && c.Type == terminal.TypePing {
			writeControl(ctx, p.br, terminal.Pong())
		}
	default:
		return terminal.CodeProtocolError, fmt.Sprintf("the browser may not send on %s", f.ch)
	}
	return "", ""
}

// dispatchFailure names why terminal.open was not picked up in time.
func (p *pump) dispatchFailure(ctx context.Context) (terminal.ErrorCode, string) {
	if !p.s.nodes.NodeOnline(ctx, p.sess.NodeID) {
		return terminal.CodeNodeOffline, fmt.Sprintf("node %q stopped heartbeating before it picked up terminal.open", p.sess.NodeID)
	}
	return terminal.CodeDispatchTimeout, fmt.Sprintf("node %q did not pick up terminal.open within %s",
		p.sess.NodeID, p.s.cfg.DispatchTimeout)
}

// nodeClosedEarly: the node's stream ended before ready. The task's
// failure, which follows within moments, says why.
func (p *pump) nodeClosedEarly(ctx context.Context, l *liveSession, onTask func() (terminal.ErrorCode, string)) (terminal.ErrorCode, string) {
	wait := time.NewTimer(3 * time.Second)
	defer wait.Stop()
	for {
		if code, msg := onTask(); code != "" {
			return code, msg
		}
		select {
		case <-l.taskCh:
		case <-time.After(200 * time.Millisecond):
		case <-wait.C:
			return terminal.CodePTYFailed, "the node closed its stream before the PTY was ready"
		case <-ctx.Done():
			return codeBrowserGone, "the gateway is shutting down"
		}
	}
}

// openFailure maps a failed terminal.open result to the browser's code.
func openFailure(result json.RawMessage) (terminal.ErrorCode, string) {
	var res api.TaskResult
	if json.Unmarshal(result, &res) != nil || res.Error == nil {
		return terminal.CodePTYFailed, "terminal.open failed without an error"
	}
	code := terminal.ErrorCode(res.Error.Code)
	switch {
	case terminal.KnownCode(code):
		return code, res.Error.Message
	case code == "terminal_session_rejected":
		return terminal.CodeNodeStreamTimeout, "the gateway refused the node's stream: " + res.Error.Message
	}
	return terminal.CodePTYFailed, res.Error.Code + ": " + res.Error.Message
}

// end is how a spliced session ended.
type end struct {
	reason string             // close reason recorded
	code   terminal.ErrorCode // error sent to the browser, if any
	msg    string
	exit   *int
}

// splice connects the legs until one ends: browser stdin and resizes to
// the node, node output to the browser and the recording. Each direction
// has one message in flight, so a slow browser stalls the node's reads and,
// through TCP, the PTY: nothing is dropped and memory stays bounded.
func (p *pump) splice(ctx context.Context, l *liveSession) {
	cfg := p.s.cfg
	s := p.s
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rec := s.openRecording(ctx, p.sess, p.log)
	if err := writeControl(ctx, p.br, terminal.Ready(p.sess.ID)); err != nil {
		p.log.Info("browser left before ready was sent", "err", err)
	}
	s.metrics.Sessions.WithLabelValues("ready").Inc()
	s.metrics.OpenSeconds.Observe(s.now().Sub(p.started).Seconds())
	s.audit.Record(ctx, audit.Entry{Actor: "browser", Action: "terminal.open", Target: p.sess.ID, Result: "ready",
		CID: p.sess.CorrelationID, Detail: fmt.Sprintf("allocation=%s node=%s user=%s mode=%s", p.sess.AllocationID,
			p.sess.NodeID, p.sess.Username, p.sess.Mode)})
	p.log.Info("terminal ready", "elapsed_ms", s.now().Sub(p.started).Milliseconds())

	ends := make(chan end, 4)
	finish := func(e end) {
		select {
		case ends <- e:
		default:
		}
	}
	for _, b := range p.stdin {
		if err := p.node.Write(sctx, websocket.MessageBinary, terminal.Encode(terminal.ChanStdin, b)); err != nil {
			finish(end{reason: "node_closed"})
		}
		rec.input(b)
	}
	deb := terminal.NewDebouncer(100*time.Millisecond, func(sz terminal.Size) {
		if err := p.node.Write(sctx, websocket.MessageBinary, terminal.Encode(terminal.ChanResize, terminal.EncodeResize(sz))); err == nil {
			rec.resize(sz)
		}
	}, terminal.DebouncerOptions{})
	defer deb.Stop()
	if p.resized && (int(p.size.Cols) != p.sess.Cols || int(p.size.Rows) != p.sess.Rows) {
		deb.Set(p.size)
	}

	var lastInput atomic.Int64
	lastInput.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // browser → node
		defer wg.Done()
		for f := range p.brIn {
			if errors.Is(f.err, terminal.ErrProtocol) {
				finish(end{reason: string(terminal.CodeProtocolError), code: terminal.CodeProtocolError, msg: f.err.Error()})
				return
			}
			if f.err != nil {
				finish(end{reason: "browser_closed"})
				return
			}
			switch f.ch {
			case terminal.ChanStdin:
				lastInput.Store(time.Now().UnixNano())
				rec.input(f.payload)
				if err := p.node.Write(sctx, websocket.MessageBinary, terminal.Encode(terminal.ChanStdin, f.payload)); err != nil {
					finish(end{reason: "node_closed"})
					return
				}
			case terminal.ChanResize:
				sz, err := terminal.DecodeResize(f.payload)
				if err != nil {
					finish(end{reason: string(terminal.CodeProtocolError), code: terminal.CodeProtocolError, msg: err.Error()})
					return
				}
				deb.Set(sz)
			case terminal.ChanControl:
				if c, err := terminal.DecodeControl(f.payload); err == nil && c.Type == terminal.TypePing {
					writeControl(sctx, p.br, terminal.Pong())
				}
			default:
				finish(end{reason: string(terminal.CodeProtocolError), code: terminal.CodeProtocolError,
					msg: fmt.Sprintf("the browser may not send on %s", f.ch)})
				return
			}
		}
	}()
	go func() { // node → browser
		defer wg.Done()
		for f := range p.nodeIn {
			if f.err != nil {
				finish(end{reason: "node_closed"})
				return
			}
			switch f.ch {
			case terminal.ChanStdout:
				rec.output(f.payload)
				if err := p.br.Write(sctx, websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, f.payload)); err != nil {
					finish(end{reason: "browser_closed"})
					return
				}
			case terminal.ChanControl:
				c, err := terminal.DecodeControl(f.payload)
				if err != nil {
					finish(end{reason: "node_protocol_error"})
					return
				}
				switch c.Type {
				case terminal.TypeExit:
					code := c.ExitCode
					writeControl(sctx, p.br, c)
					finish(end{reason: "exit", exit: &code})
					return
				case terminal.TypeError:
					finish(end{reason: string(c.Error), code: c.Error, msg: c.Message})
					return
				case terminal.TypePing:
					writeControl(sctx, p.node, terminal.Pong())
				}
			}
		}
	}()

	life := time.NewTimer(max(cfg.MaxLifetime-s.now().Sub(p.started), 0))
	defer life.Stop()
	idleCheck := time.NewTicker(max(min(cfg.IdleTimeout/4, time.Second), 10*time.Millisecond))
	defer idleCheck.Stop()
	keep := time.NewTicker(cfg.KeepAlive)
	defer keep.Stop()
	var e end
wait:
	for {
		select {
		case e = <-ends:
			break wait
		case k := <-l.kill:
			e = end{reason: string(k.code), code: k.code, msg: k.msg}
			break wait
		case <-life.C:
			e = end{reason: string(terminal.CodeSessionMaxLifetime), code: terminal.CodeSessionMaxLifetime,
				msg: fmt.Sprintf("the session reached its maximum lifetime of %s", cfg.MaxLifetime)}
			break wait
		case <-idleCheck.C:
			if time.Since(time.Unix(0, lastInput.Load())) >= cfg.IdleTimeout {
				e = end{reason: string(terminal.CodeSessionIdleTimeout), code: terminal.CodeSessionIdleTimeout,
					msg: fmt.Sprintf("no input for %s", cfg.IdleTimeout)}
				break wait
			}
		case <-keep.C:
			for _, c := range []struct {
				conn *websocket.Conn
				who  string
			}{{p.br, "browser_unreachable"}, {p.node, "node_unreachable"}} {
				go func() {
					pctx, pcancel := context.WithTimeout(sctx, cfg.KeepAlive)
					defer pcancel()
					if err := c.conn.Ping(pctx); err != nil && sctx.Err() == nil {
						finish(end{reason: c.who})
					}
				}()
			}
		case <-ctx.Done():
			e = end{reason: "gateway_shutdown"}
			break wait
		}
	}
	p.finish(sctx, cancel, &wg, e, rec)
}

// finish closes both legs as e says, then records and audits the end.
func (p *pump) finish(ctx context.Context, cancel context.CancelFunc, wg *sync.WaitGroup, e end, rec *recording) {
	s := p.s
	if e.code != "" {
		writeControl(ctx, p.br, terminal.Error(e.code, e.msg))
	}
	brCode, brReason := websocket.StatusNormalClosure, e.reason
	switch {
	case e.code != "":
		brCode = websocket.StatusCode(terminal.CloseCode(e.code))
	case e.reason == "node_closed" || e.reason == "node_unreachable" || e.reason == "node_protocol_error":
		brCode = websocket.StatusCode(terminal.CloseNodeStream)
	case e.reason == "gateway_shutdown":
		brCode = websocket.StatusGoingAway
	}
	var cw sync.WaitGroup
	cw.Add(2)
	go func() { defer cw.Done(); p.br.Close(brCode, brReason) }()
	go func() { defer cw.Done(); p.node.Close(websocket.StatusNormalClosure, e.reason) }()
	cw.Wait()
	cancel()
	wg.Wait()
	bytes := rec.close()
	if e.code != "" {
		s.failTerminal(ctx, p.sess.ID, e.code, e.msg)
		s.closeTerminal(ctx, p.sess.ID, e.reason, nil, bytes)
	} else {
		s.closeTerminal(ctx, p.sess.ID, e.reason, e.exit, bytes)
	}
	detail := "reason=" + e.reason
	if e.exit != nil {
		detail += fmt.Sprintf(" exit=%d", *e.exit)
	}
	s.metrics.Sessions.WithLabelValues("closed_" + e.reason).Inc()
	s.audit.Record(ctx, audit.Entry{Actor: "browser", Action: "terminal.close", Target: p.sess.ID, Result: e.reason,
		CID: p.sess.CorrelationID, Detail: detail + fmt.Sprintf(" duration=%s recording_bytes=%d",
			s.now().Sub(p.started).Round(time.Millisecond), bytes)})
	p.log.Info("terminal closed", "reason", e.reason, "recording_bytes", bytes)
}

// recording is a session's asciicast v2 file. A nil *recording records
// nothing (no recording directory, or the file could not be created).
type recording struct {
	f   *os.File
	buf *bufio.Writer
	n   *countWriter
	rec *terminal.Recorder
	log *slog.Logger
}

type countWriter struct {
	w io.Writer
	n atomic.Int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// openRecording creates <recording dir>/<session id>.cast and records its
// path on the session.
func (s *Gateway) openRecording(ctx context.Context, sess store.TerminalSession, log *slog.Logger) *recording {
	dir := s.cfg.RecordingDir
	if dir == "" {
		return nil
	}
	path := filepath.Join(dir, sess.ID+".cast")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		log.Error("terminal recording disabled for this session", "err", err)
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		log.Error("terminal recording disabled for this session", "err", err)
		return nil
	}
	r := &recording{f: f, buf: bufio.NewWriterSize(f, 64<<10), log: log}
	r.n = &countWriter{w: r.buf}
	r.rec, err = terminal.NewRecorder(r.n, terminal.Header{Width: sess.Cols, Height: sess.Rows,
		Title: sess.Username + "@" + sess.NodeID, Env: map[string]string{"TERM": "xterm-256color"}},
		terminal.RecorderOptions{RecordInput: s.cfg.RecordInput})
	if err != nil {
		f.Close()
		log.Error("terminal recording disabled for this session", "err", err)
		return nil
	}
	if _, err := s.store.UpdateTerminalSession(ctx, sess.ID, func(t *store.TerminalSession) error {
		t.RecordingPath = path
		return nil
	}); err != nil {
		log.Warn("record terminal recording path", "err", err)
	}
	return r
}

func (r *recording) output(b []byte) {
	if r != nil {
		r.note(r.rec.Output(b))
	}
}

func (r *recording) input(b []byte) {
	if r != nil {
		r.note(r.rec.Input(b))
	}
}

func (r *recording) resize(sz terminal.Size) {
	if r != nil {
		r.note(r.rec.Resize(sz))
	}
}

// note logs the first write error; the Recorder keeps it sticky, so the
// session goes on without recording rather than failing.
func (r *recording) note(err error) {
	if err != nil && r.log != nil {
		r.log.Error("terminal recording stopped", "err", err)
		r.log = nil
	}
}

// close flushes and syncs the file and returns its size.
func (r *recording) close() int64 {
	if r == nil {
		return 0
	}
	r.rec.Close()
	if err := r.buf.Flush(); err != nil {
		r.note(err)
	}
	if err := r.f.Sync(); err != nil {
		r.note(err)
	}
	r.f.Close()
	return r.n.n.Load()
}
