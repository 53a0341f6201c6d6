package termgw

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

const (
	// maxTerminalFrame bounds one WebSocket message on either leg; with one
	// message in flight per direction it bounds a session's buffers.
	maxTerminalFrame = 1 << 20
	// maxPendingStdin bounds keystrokes typed before the PTY is ready.
	maxPendingStdin = 64 << 10
	// openWithoutStreamGrace is how long a terminal.open success may precede
	// the node's stream before the session fails terminal_open_without_stream.
	openWithoutStreamGrace = 2 * time.Second
)

// Browser is the browser's end of the chain (GET /api/v1/terminal). It
// always accepts the upgrade, so every refusal reaches the browser as an
// error frame and a 4xxx close code rather than an unreadable 1006.
func (s *Gateway) Browser(w http.ResponseWriter, r *http.Request) {
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{terminal.Subprotocol},
		// Origin is checked below, after the upgrade, so the browser can be
		// told why; nothing is read or written for a foreign page first.
		InsecureSkipVerify: true,
	})
	if err != nil {
		s.metrics.Sessions.WithLabelValues("upgrade_failed").Inc()
		httpapi.Logger(r.Context(), s.log).Info("terminal upgrade failed", "err", err)
		return
	}
	conn.SetReadLimit(maxTerminalFrame)
	ctx, cancel := s.sessionContext(r)
	defer cancel()
	sess, code, msg := s.admitTerminal(ctx, r)
	if code != "" {
		s.metrics.Sessions.WithLabelValues(string(code)).Inc()
		cid := httpapi.CorrelationID(ctx)
		if sess.ID != "" {
			cid = sess.CorrelationID
			s.failTerminal(ctx, sess.ID, code, msg)
		}
		httpapi.Logger(ctx, s.log).Info("terminal refused", "session_id", sess.ID, "code", code, "msg", msg, "session_correlation_id", cid)
		s.audit.Record(ctx, audit.Entry{Actor: "browser", Action: "terminal.open", Target: orDash(sess.ID), Result: string(code),
			CID: cid, Detail: msg})
		sendError(ctx, conn, code, msg)
		return
	}
	s.runTerminal(ctx, conn, sess)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// admitTerminal checks the upgrade request: Origin, no token in the URL,
// exactly one token subprotocol, and a token that is known, unused,
// unexpired, for this allocation, whose allocation is still active. The
// token is burned by the first redemption, whatever follows.
func (s *Gateway) admitTerminal(ctx context.Context, r *http.Request) (store.TerminalSession, terminal.ErrorCode, string) {
	var none store.TerminalSession
	if origin := r.Header.Get("Origin"); origin != "" && !s.originAllowed(origin, r.Host) {
		return none, terminal.CodeOriginForbidden, fmt.Sprintf("origin %q may not open terminals", origin)
	}
	q := r.URL.Query()
	for k := range q {
		if k != "allocation_id" && strings.Contains(strings.ToLower(k), "token") {
			return none, terminal.CodeTokenInURL, "the token must be sent as a WebSocket subprotocol, never in the URL"
		}
	}
	var offered []string
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		offered = append(offered, strings.Split(v, ",")...)
	}
	raw, err := terminal.TokenFromProtocols(offered)
	if err != nil {
		if strings.Contains(err.Error(), "no token") || strings.Contains(err.Error(), "empty token") {
			return none, terminal.CodeTokenInvalid, "no terminal token was offered"
		}
		return none, terminal.CodeProtocolError, err.Error()
	}
	now := s.now().UTC()
	sess, err := s.store.RedeemTerminalToken(ctx, httpapi.HashToken(raw), now)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return none, terminal.CodeTokenInvalid, "the terminal token is not known"
	case errors.Is(err, store.ErrConflict):
		return none, terminal.CodeTokenReused, "the terminal token was already used"
	case err != nil:
		httpapi.Logger(ctx, s.log).Error("redeem terminal token", "err", err)
		return none, terminal.CodeGatewayError, "the gateway could not check the token"
	}
	if !now.Before(sess.TokenExpiresAt) {
		return sess, terminal.CodeTokenExpired, fmt.Sprintf("the terminal token expired at %s",
			sess.TokenExpiresAt.Format(time.RFC3339))
	}
	if want := q.Get("allocation_id"); want != sess.AllocationID {
		return sess, terminal.CodeTokenWrongAllocation,
			fmt.Sprintf("the token is for allocation %q, not %q", sess.AllocationID, want)
	}
	a, err := s.store.GetAllocation(ctx, sess.AllocationID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return sess, terminal.CodeGatewayError, "the gateway could not read the allocation"
	}
	if err != nil || a.State != api.AllocationActive {
		return sess, terminal.CodeAllocationInactive, fmt.Sprintf("allocation %q is %s", sess.AllocationID, a.State)
	}
	return sess, "", ""
}

// originAllowed accepts the gateway's own origin and the configured ones.
func (s *Gateway) originAllowed(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, host) {
		return true
	}
	for _, o := range s.cfg.AllowedOrigins {
		if strings.EqualFold(strings.TrimSuffix(o, "/"), origin) {
			return true
		}
	}
	return false
}

// failTerminal records that a session failed with code.
func (s *Gateway) failTerminal(ctx context.Context, sid string, code terminal.ErrorCode, msg string) {
	now := s.now().UTC()
	s.appendTerminalState(ctx, sid, terminal.StateFailed, string(code)+": "+msg, func(t *store.TerminalSession) {
		t.ErrorCode, t.ErrorMessage, t.CloseReason = string(code), msg, string(code)
		if t.ClosedAt.IsZero() {
			t.ClosedAt = now
		}
	})
}

// sendError sends an error frame and closes with the code's 4xxx status.
func sendError(ctx context.Context, conn *websocket.Conn, code terminal.ErrorCode, msg string) {
	writeControl(ctx, conn, terminal.Error(code, msg))
	conn.Close(websocket.StatusCode(terminal.CloseCode(code)), string(code))
}

// writeControl writes one control frame (bounded by a short deadline).
func writeControl(ctx context.Context, conn *websocket.Conn, c terminal.Control) error {
	b, err := terminal.EncodeControl(c)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return conn.Write(wctx, websocket.MessageBinary, terminal.Encode(terminal.ChanControl, b))
}

func newNonce() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// runTerminal drives an admitted session: it queues terminal.open, reports
// progress to the browser, waits for the node's stream and its ready frame
// under deadlines, then splices the two streams until one side ends.
func (s *Gateway) runTerminal(ctx context.Context, br *websocket.Conn, sess store.TerminalSession) {
	log := s.log.With("session_id", sess.ID, "correlation_id", sess.CorrelationID, "node_id", sess.NodeID,
		"allocation_id", sess.AllocationID)
	cfg := s.cfg
	started := s.now()
	s.appendTerminalState(ctx, sess.ID, terminal.StateBrowserWSReady, "", nil)

	fail := func(code terminal.ErrorCode, msg string) {
		log.Warn("terminal failed", "code", code, "msg", msg)
		s.metrics.Sessions.WithLabelValues(string(code)).Inc()
		s.failTerminal(ctx, sess.ID, code, msg)
		s.audit.Record(ctx, audit.Entry{Actor: "browser", Action: "terminal.open", Target: sess.ID, Result: string(code),
			CID: sess.CorrelationID, Detail: msg})
		sendError(ctx, br, code, msg)
	}
	if !s.nodes.NodeOnline(ctx, sess.NodeID) {
		fail(terminal.CodeNodeOffline, fmt.Sprintf("node %q has no live agent connection", sess.NodeID))
		return
	}

	// Queue terminal.open. It expires with the dispatch deadline, so an agent
	// that reconnects later never opens a session nobody waits for.
	l := &liveSession{id: sess.ID, nodeID: sess.NodeID, allocID: sess.AllocationID, nonce: newNonce(),
		mintedBy: sess.MintedByTokenID, node: make(chan *websocket.Conn), taskCh: make(chan struct{}, 1), kill: make(chan killReq, 1),
		done: make(chan struct{})}
	params := task.TerminalOpenParams{SessionID: sess.ID, AllocationID: sess.AllocationID, Nonce: l.nonce,
		Mode: sess.Mode, Cols: sess.Cols, Rows: sess.Rows, MaxLifetime: api.Duration(cfg.MaxLifetime),
		StreamURL: cfg.AdvertiseURL}
	switch sess.Mode {
	case task.TerminalModeSerial:
		params.InstanceID = sess.InstanceID
	case task.TerminalModeVMSSH:
		params.Username = sess.Username
		vm, err := s.sessionVM(ctx, sess)
		if err != nil {
			fail(terminal.CodeAllocationInactive, err.Error())
			return
		}
		params.VMName = vm
	default:
		params.Username = sess.Username
	}
	pb, _ := json.Marshal(params)
	now := s.now().UTC()
	t := store.Task{ID: httpapi.NewID("tsk_"), NodeID: sess.NodeID, Type: task.TypeTerminalOpen, Params: pb,
		State: api.TaskQueued, CorrelationID: sess.CorrelationID, CreatedBy: "terminal-gateway",
		CreatedAt: now, ExpiresAt: now.Add(cfg.DispatchTimeout)}
	l.taskID = t.ID
	if !s.term.add(l, cfg.MaxSessionsPerNode) {
		s.metrics.LimitRefusals.WithLabelValues(codeTerminalLimit).Inc()
		fail(terminal.CodeSessionLimit, fmt.Sprintf("node %q already has %d open terminal sessions on this gateway; "+
			"close one or retry later", sess.NodeID, cfg.MaxSessionsPerNode))
		return
	}
	// The lease says this replica holds the session; a surviving replica
	// fails the session if this one dies (lease.go).
	s.holdLease(ctx, sess.ID)
	defer func() {
		s.term.remove(l)
		s.dropLease(ctx, sess.ID)
		close(l.done)
	}()
	// Checked once registered: a revocation from now on reaches the session
	// through Event, and an earlier one is seen here.
	if code, msg := s.liveRevoked(ctx, l); code != "" {
		fail(code, msg)
		return
	}
	if err := s.tasks.Enqueue(ctx, t); err != nil {
		fail(terminal.CodeGatewayError, "queue terminal.open: "+err.Error())
		return
	}
	s.appendTerminalState(ctx, sess.ID, terminal.StateTerminalOpenSent, "task "+t.ID,
		func(ts *store.TerminalSession) { ts.TaskID = t.ID })
	writeControl(ctx, br, terminal.Status(terminal.ProgressQueued))

	// One reader per leg for the whole session; an unbuffered channel hands
	// each message on, so a slow consumer stops the reader (backpressure).
	brIn := readFrames(ctx, br)
	p := &pump{s: s, log: log, sess: sess, br: br, brIn: brIn, started: started}
	code, msg := p.open(ctx, l, t.ID)
	if code != "" {
		// Cancel first, so that once the browser has its answer no node can
		// still pick up this terminal.open.
		s.cancelTerminalTask(ctx, t.ID)
		if code != codeBrowserGone {
			fail(code, msg)
		} else {
			s.closeTerminal(ctx, sess.ID, "browser_closed", nil, 0)
		}
		if p.node != nil {
			p.node.Close(websocket.StatusGoingAway, string(code))
		}
		return
	}
	p.splice(ctx, l)
}

// cancelTerminalTask cancels a terminal.open the session no longer needs,
// if no node has picked it up yet, with its task.cancel record. A
// picked-up one is left to finish: the node's stream is refused (410) and
// its result recorded as it reports it.
func (s *Gateway) cancelTerminalTask(ctx context.Context, id string) {
	if t, err := s.store.GetTask(context.WithoutCancel(ctx), id); err != nil || t.State != api.TaskQueued {
		return
	}
	if _, err := s.store.CancelTask(context.WithoutCancel(ctx), id, s.now().UTC(), func(t store.Task) []store.AuditEvent {
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: "terminal-gateway", Action: "task.cancel", Target: id,
			Result: "canceled", CID: t.CorrelationID, Detail: "terminal session ended before a node took the task"})}
	}); err != nil &&
		!errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("cancel terminal.open", "task_id", id, "err", err)
	}
}

// closeTerminal records the end of a session that did not fail.
func (s *Gateway) closeTerminal(ctx context.Context, sid, reason string, exit *int, recBytes int64) {
	now := s.now().UTC()
	_, err := s.store.UpdateTerminalSession(context.WithoutCancel(ctx), sid, func(t *store.TerminalSession) error {
		if t.ClosedAt.IsZero() {
			t.ClosedAt = now
		}
		t.CloseReason = reason
		if exit != nil {
			t.ExitCode, t.Exited = *exit, true
		}
		if recBytes > 0 {
			t.RecordingBytes = recBytes
		}
		return nil
	})
	if err != nil {
		s.log.Warn("record terminal close", "session_id", sid, "err", err)
	}
}

// frame is one message read from a leg; err ends the leg.
type frame struct {
	ch      terminal.Channel
	payload []byte
	err     error
}

// readFrames reads binary frames from conn until it fails or ctx ends; the
// last value carries the error. The channel is unbuffered.
func readFrames(ctx context.Context, conn *websocket.Conn) <-chan frame {
	out := make(chan frame)
	go func() {
		defer close(out)
		for {
			typ, msg, err := conn.Read(ctx)
			var f frame
			switch {
			case err != nil:
				f.err = err
			case typ != websocket.MessageBinary:
				f.err = fmt.Errorf("%w: text message (frames are binary)", terminal.ErrProtocol)
			default:
				f.ch, f.payload, f.err = terminal.Decode(msg)
			}
			select {
			case out <- f:
			case <-ctx.Done():
				return
			}
			if f.err != nil {
				return
			}
		}
	}()
	return out
}
