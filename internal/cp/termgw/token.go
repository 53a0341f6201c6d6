package termgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// maxTerminalTokenTTL is the longest a terminal token may live: tokens
// are short-lived, at most 60 s.
const maxTerminalTokenTTL = 60 * time.Second

// MintToken mints a single-use terminal token for an active
// allocation and creates its session in state token_ready.
func (s *Gateway) MintToken(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	refuse := func(he *httpapi.Error) error {
		s.metrics.Mints.WithLabelValues(he.Code).Inc()
		s.audit.Record(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "terminal.token_mint", Target: id, Result: he.Code,
			CID: httpapi.CorrelationID(ctx), Detail: "terminal_token_mint_failed: " + he.Message})
		return he
	}
	var req api.TerminalTokenRequest
	if r.ContentLength != 0 {
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			var he *httpapi.Error
			if errors.As(err, &he) {
				return refuse(he)
			}
			return err
		}
	}
	size, fields := terminalSize(req)
	if len(fields) > 0 {
		return refuse(httpapi.Invalid(fields))
	}
	a, err := s.store.GetAllocation(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return refuse(httpapi.Errorf(http.StatusNotFound, "allocation_not_found", "allocation %q not found", id))
	} else if err != nil {
		return err
	}
	if a.State != api.AllocationActive {
		return refuse(httpapi.Errorf(http.StatusConflict, "allocation_not_active",
			"allocation %q is %s; a terminal needs an active allocation", a.ID, a.State))
	}
	mode, nodeID := task.TerminalModePTY, a.HostID
	switch {
	case a.IsSlice():
		// The slice's user exists in its VM, not on the host: the node
		// brokers SSH into the VM its workflow provisioned.
		mode = task.TerminalModeVMSSH
		_, vmNode, err := s.sliceVM(ctx, a)
		var he *httpapi.Error
		if errors.As(err, &he) {
			return refuse(he)
		} else if err != nil {
			return err
		}
		nodeID = vmNode
	case a.InstanceID != "":
		mode = task.TerminalModeSerial
		in, err := s.store.GetInstance(ctx, a.InstanceID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err != nil || in.DesiredState == api.DesiredDeleted {
			return refuse(httpapi.Errorf(http.StatusConflict, "allocation_not_bound",
				"allocation %q is bound to instance %q, which no longer exists", a.ID, a.InstanceID))
		}
		nodeID = in.HostID
	}
	if nodeID == "" {
		return refuse(httpapi.Errorf(http.StatusConflict, "allocation_not_bound", "allocation %q is not bound to a node", a.ID))
	}
	if limit := s.cfg.MaxSessionsPerNode; s.term.nodeCount(nodeID) >= limit {
		s.metrics.LimitRefusals.WithLabelValues(codeTerminalLimit).Inc()
		return refuse(&httpapi.Error{Status: http.StatusTooManyRequests, RetryAfter: terminalRetryAfter, CodedError: api.CodedError{
			Code:    codeTerminalLimit,
			Message: fmt.Sprintf("node %q already has %d open terminal sessions on this gateway; close one or retry later", nodeID, limit)}})
	}
	now := s.now().UTC()
	raw := httpapi.NewToken("drv_term_")
	first, _ := json.Marshal([]api.TerminalStateEvent{{State: string(terminal.StateTokenReady), At: now}})
	sess := store.TerminalSession{ID: httpapi.NewID("ts_"), AllocationID: a.ID, NodeID: nodeID, Username: a.Username,
		Mode: mode, InstanceID: a.InstanceID, TokenHash: httpapi.HashToken(raw),
		TokenExpiresAt: now.Add(s.cfg.TokenTTL), State: string(terminal.StateTokenReady), States: first,
		CorrelationID: httpapi.CorrelationID(ctx), Cols: int(size.Cols), Rows: int(size.Rows), CreatedBy: httpapi.Actor(ctx),
		CreatedAt: now}
	if p, ok := httpapi.PrincipalFrom(ctx); ok {
		sess.MintedByTokenID = p.TokenID
	}
	// The token is a credential: it is stored with its record (ADR 0016).
	if err := s.store.CreateTerminalSession(ctx, sess, s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx),
		Action: "terminal.token_mint", Target: sess.ID, Result: "ok", CID: sess.CorrelationID,
		Detail: fmt.Sprintf("allocation=%s node=%s mode=%s", a.ID, nodeID, mode)})); err != nil {
		return err
	}
	s.metrics.Mints.WithLabelValues("ok").Inc()
	httpapi.WriteJSON(w, http.StatusCreated, api.TerminalToken{Token: raw, SessionID: sess.ID, AllocationID: a.ID,
		NodeID: nodeID, ExpiresAt: sess.TokenExpiresAt,
		URL:         "/api/v1/terminal?allocation_id=" + url.QueryEscape(a.ID),
		Subprotocol: terminal.Subprotocol})
	return nil
}

// terminalSize validates the requested initial size (default 80x24).
func terminalSize(req api.TerminalTokenRequest) (terminal.Size, []api.FieldError) {
	if req.Cols == 0 && req.Rows == 0 {
		return terminal.Size{Cols: 80, Rows: 24}, nil
	}
	var fe []api.FieldError
	if req.Cols < 1 || req.Cols > terminal.MaxCols {
		fe = append(fe, api.FieldError{Field: "cols", Message: fmt.Sprintf("must be 1-%d", terminal.MaxCols)})
	}
	if req.Rows < 1 || req.Rows > terminal.MaxRows {
		fe = append(fe, api.FieldError{Field: "rows", Message: fmt.Sprintf("must be 1-%d", terminal.MaxRows)})
	}
	return terminal.Size{Cols: uint16(req.Cols), Rows: uint16(req.Rows)}, fe
}

// terminalSessionView is a session's API form. A token that was never
// redeemed and has expired shows as closed with close_reason
// token_expired; a failure an operator must act on carries its signal.
func terminalSessionView(t store.TerminalSession, now time.Time) api.TerminalSession {
	v := api.TerminalSession{ID: t.ID, AllocationID: t.AllocationID, NodeID: t.NodeID, Username: t.Username,
		Mode: t.Mode, InstanceID: t.InstanceID, State: t.State, ErrorCode: t.ErrorCode, ErrorMessage: t.ErrorMessage,
		TaskID: t.TaskID, CorrelationID: t.CorrelationID, Cols: t.Cols, Rows: t.Rows, CreatedBy: t.CreatedBy,
		CreatedAt: t.CreatedAt, CloseReason: t.CloseReason, RecordingBytes: t.RecordingBytes}
	_ = json.Unmarshal(t.States, &v.States)
	if v.States == nil {
		v.States = []api.TerminalStateEvent{}
	}
	if !t.ClosedAt.IsZero() {
		c := t.ClosedAt
		v.ClosedAt = &c
	} else if t.TokenUsedAt.IsZero() && !t.TokenExpiresAt.IsZero() && now.After(t.TokenExpiresAt) {
		c := t.TokenExpiresAt
		v.ClosedAt, v.CloseReason = &c, "token_expired"
	}
	code := t.ErrorCode
	if code == "" {
		code = t.CloseReason
	}
	if sig, ok := signal.FromTerminalCode(terminal.ErrorCode(code)); ok {
		v.Signal = string(sig)
	}
	if t.Exited {
		code := t.ExitCode
		v.ExitCode = &code
	}
	if t.RecordingPath != "" {
		v.RecordingURL = "/api/v1/terminal-sessions/" + t.ID + "/recording"
	}
	return v
}

// ListAllocationSessions is GET /api/v1/allocations/{id}/sessions.
func (s *Gateway) ListAllocationSessions(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if _, err := s.store.GetAllocation(r.Context(), id); err != nil {
		return httpapi.StoreError(err, "allocation", id)
	}
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	ss, err := s.store.ListTerminalSessions(r.Context(), store.TerminalSessionFilter{AllocationID: id, Limit: limit})
	if err != nil {
		return err
	}
	out := make([]api.TerminalSession, 0, len(ss))
	for _, t := range ss {
		out = append(out, terminalSessionView(t, s.now()))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// ShowSession is GET /api/v1/terminal-sessions/{sid}.
func (s *Gateway) ShowSession(w http.ResponseWriter, r *http.Request) error {
	t, err := s.store.GetTerminalSession(r.Context(), r.PathValue("sid"))
	if err != nil {
		return httpapi.StoreError(err, "terminal_session", r.PathValue("sid"))
	}
	httpapi.WriteJSON(w, http.StatusOK, terminalSessionView(t, s.now()))
	return nil
}

// Recording serves a session's asciicast v2 recording. Only files
// inside the configured recording directory are ever opened.
func (s *Gateway) Recording(w http.ResponseWriter, r *http.Request) error {
	sid := r.PathValue("sid")
	t, err := s.store.GetTerminalSession(r.Context(), sid)
	if err != nil {
		return httpapi.StoreError(err, "terminal_session", sid)
	}
	if t.RecordingPath == "" {
		return httpapi.Errorf(http.StatusNotFound, "recording_not_found", "session %q has no recording (it never became ready)", sid)
	}
	dir := s.cfg.RecordingDir
	rel, err := filepath.Rel(dir, t.RecordingPath)
	if dir == "" || err != nil || !filepath.IsLocal(rel) {
		return httpapi.Errorf(http.StatusNotFound, "recording_not_found",
			"recording of session %q is not in this replica's recording directory", sid)
	}
	f, err := os.Open(t.RecordingPath)
	if errors.Is(err, os.ErrNotExist) {
		return httpapi.Errorf(http.StatusNotFound, "recording_not_found",
			"recording of session %q is not on this replica (%s)", sid, t.RecordingPath)
	} else if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-asciicast")
	w.Header().Set("Content-Disposition", fmt.Sprintf("inline; filename=%q", sid+".cast"))
	http.ServeContent(w, r, sid+".cast", st.ModTime(), f)
	return nil
}

// appendTerminalState records a readiness hop (or failure) of a session.
// fn, when non-nil, edits the record in the same update.
func (s *Gateway) appendTerminalState(ctx context.Context, sid string, st terminal.State, detail string,
	fn func(*store.TerminalSession)) {
	now := s.now().UTC()
	_, err := s.store.UpdateTerminalSession(context.WithoutCancel(ctx), sid, func(t *store.TerminalSession) error {
		var evs []api.TerminalStateEvent
		_ = json.Unmarshal(t.States, &evs)
		evs = append(evs, api.TerminalStateEvent{State: string(st), At: now,
			ElapsedMS: now.Sub(t.CreatedAt).Milliseconds(), Detail: detail})
		b, err := json.Marshal(evs)
		if err != nil {
			return err
		}
		t.States, t.State = b, string(st)
		if fn != nil {
			fn(t)
		}
		return nil
	})
	if err != nil {
		s.log.Warn("record terminal state", "session_id", sid, "state", st, "err", err)
	}
}
