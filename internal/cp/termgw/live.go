package termgw

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// liveSession is a terminal session this replica's gateway holds a browser
// for, while it waits for (or splices) the node's stream.
type liveSession struct {
	id, nodeID, allocID, nonce, taskID string
	mintedBy                           string               // the operator token id that minted it ("" unknown)
	node                               chan *websocket.Conn // the node's stream, handed over once
	taskCh                             chan struct{}        // the terminal.open task changed
	kill                               chan killReq         // ended from outside (release, mTLS failure)
	done                               chan struct{}        // closed when the session ended
	attached                           atomic.Bool
}

type killReq struct {
	code terminal.ErrorCode
	msg  string
}

func (l *liveSession) notifyTask() {
	select {
	case l.taskCh <- struct{}{}:
	default:
	}
}

func (l *liveSession) end(code terminal.ErrorCode, msg string) {
	select {
	case l.kill <- killReq{code, msg}:
	default:
	}
}

// termGateway indexes this replica's live sessions by session and task id,
// and counts them per node.
type termGateway struct {
	mu     sync.Mutex
	byID   map[string]*liveSession
	byTask map[string]*liveSession
	byNode map[string]int
}

func newTermGateway() *termGateway {
	return &termGateway{byID: map[string]*liveSession{}, byTask: map[string]*liveSession{}, byNode: map[string]int{}}
}

// add registers l unless its node already has perNode live sessions.
func (g *termGateway) add(l *liveSession, perNode int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byNode[l.nodeID] >= perNode {
		return false
	}
	g.byID[l.id] = l
	g.byTask[l.taskID] = l
	g.byNode[l.nodeID]++
	return true
}

func (g *termGateway) remove(l *liveSession) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byID[l.id] != l {
		return
	}
	delete(g.byID, l.id)
	delete(g.byTask, l.taskID)
	if g.byNode[l.nodeID]--; g.byNode[l.nodeID] <= 0 {
		delete(g.byNode, l.nodeID)
	}
}

// nodeCount is the number of live sessions of node.
func (g *termGateway) nodeCount(node string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byNode[node]
}

// matching returns the live sessions for which keep is true.
func (g *termGateway) matching(keep func(*liveSession) bool) []*liveSession {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*liveSession
	for _, l := range g.byID {
		if keep(l) {
			out = append(out, l)
		}
	}
	return out
}

func (g *termGateway) get(id string) *liveSession {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byID[id]
}

// taskChanged wakes the session waiting on task id (claimed or finished).
func (g *termGateway) taskChanged(id string) {
	g.mu.Lock()
	l := g.byTask[id]
	g.mu.Unlock()
	if l != nil {
		l.notifyTask()
	}
}

// Subscribe wakes the session waiting on a terminal.open when
// a node claims it and when it finishes on this replica.
func (s *Gateway) Subscribe(b *taskbus.Bus) {
	b.OnDispatched(task.TypeTerminalOpen, func(_ context.Context, e taskbus.Dispatched) { s.term.taskChanged(e.Task.ID) })
	b.OnFinished(task.TypeTerminalOpen, func(_ context.Context, e taskbus.Finished) { s.term.taskChanged(e.Task.ID) })
}

// closeAllocation ends every live session of an allocation.
func (g *termGateway) CloseAllocation(allocID string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range g.byID {
		if l.allocID == allocID {
			l.end(terminal.CodeAllocationInactive, "the allocation was released")
		}
	}
}

// count is the number of live sessions (metrics).
func (g *termGateway) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.byID)
}

// NodeStream is the node's end of a session: the agent of the
// session's node dials it over mTLS with the nonce from terminal.open. The
// stream is handed to the session's goroutine, and the handler returns when
// the session ends. A node may only open streams for sessions sent to it.
func (s *Gateway) NodeStream(w http.ResponseWriter, r *http.Request, nodeID string) error {
	ctx := r.Context()
	sid := r.PathValue("session_id")
	refuse := func(status int, code, format string, args ...any) error {
		he := httpapi.Errorf(status, code, format, args...)
		s.metrics.NodeStreams.WithLabelValues(code).Inc()
		if status == http.StatusForbidden {
			s.audit.Record(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "terminal.node_stream", Target: sid,
				Result: code, CID: httpapi.CorrelationID(ctx), Detail: he.Message})
		}
		return he
	}
	l := s.term.get(sid)
	if l == nil {
		t, err := s.store.GetTerminalSession(ctx, sid)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return refuse(http.StatusNotFound, "terminal_session_unknown", "no terminal session %q", sid)
		case err != nil:
			return err
		case t.NodeID != nodeID:
			return refuse(http.StatusForbidden, "terminal_session_wrong_node",
				"terminal session %q was not sent to node %q", sid, nodeID)
		case !t.ClosedAt.IsZero():
			return refuse(http.StatusGone, "terminal_session_closed", "terminal session %q already ended (%s)", sid, t.CloseReason)
		}
		return refuse(http.StatusNotFound, "terminal_session_unknown",
			"terminal session %q is not waiting for a node stream on this gateway", sid)
	}
	if l.nodeID != nodeID {
		return refuse(http.StatusForbidden, "terminal_session_wrong_node",
			"terminal session %q was not sent to node %q", sid, nodeID)
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(terminal.HeaderNonce)), []byte(l.nonce)) != 1 {
		return refuse(http.StatusForbidden, "terminal_nonce_mismatch",
			"the stream's nonce does not match terminal session %q", sid)
	}
	if !l.attached.CompareAndSwap(false, true) {
		return refuse(http.StatusConflict, "terminal_stream_exists", "terminal session %q already has a node stream", sid)
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{terminal.Subprotocol}})
	if err != nil {
		s.metrics.NodeStreams.WithLabelValues("upgrade_failed").Inc()
		httpapi.Logger(ctx, s.log).Warn("terminal node stream upgrade", "session_id", sid, "node_id", nodeID, "err", err)
		l.attached.Store(false)
		return nil // Accept answered the request
	}
	conn.SetReadLimit(maxTerminalFrame)
	s.metrics.NodeStreams.WithLabelValues("ok").Inc()
	select {
	case l.node <- conn:
	case <-l.done:
		conn.Close(websocket.StatusGoingAway, "terminal_session_closed")
		return nil
	}
	<-l.done
	return nil
}

// NodeMTLS runs before nodeAuth on the stream route: a stream that
// arrives without a client certificate but with the right nonce is the
// node of that session behind something that strips client certificates
// (a public edge in front of the node-facing endpoint, say). The
// session fails at once with terminal_node_stream_mtls_failed instead of
// waiting for node_stream_timeout; the request is refused by nodeAuth.
func (s *Gateway) NodeMTLS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			if l := s.term.get(r.PathValue("session_id")); l != nil &&
				subtle.ConstantTimeCompare([]byte(r.Header.Get(terminal.HeaderNonce)), []byte(l.nonce)) == 1 {
				l.end(terminal.CodeNodeStreamMTLSFailed,
					"the node's stream reached the gateway without a client certificate")
			}
		}
		next.ServeHTTP(w, r)
	})
}

// sessionContext ends when the request ends or the server stops.
func (s *Gateway) sessionContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	if s.baseCtx != nil {
		stop := context.AfterFunc(s.baseCtx, cancel)
		return ctx, func() { stop(); cancel() }
	}
	return ctx, cancel
}
