package preflight

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// frameGrace is added to the per-hop timeout while waiting for the
// gateway's next frame, so the gateway's own timers (node_stream_timeout,
// dispatch_timeout) fire before preflight calls the session stuck.
const frameGrace = 5 * time.Second

// invalidToken is offered by the probe without --run-ws-smoke: the gateway
// must refuse it on purpose (error frame, 4xxx close).
const invalidToken = "preflight-invalid"

// wsSession is the browser leg opened with the minted token.
type wsSession struct {
	conn   *websocket.Conn
	closed bool
}

func (r *run) closeSession() {
	if r.ws != nil && !r.ws.closed {
		r.ws.conn.CloseNow()
		r.ws.closed = true
	}
}

// terminalURL is the gateway's browser WebSocket URL for the allocation.
func (r *run) terminalURL() string {
	base := r.cfg.TerminalBase
	switch {
	case strings.HasPrefix(base, "https://"):
		base = "wss://" + strings.TrimPrefix(base, "https://")
	case strings.HasPrefix(base, "http://"):
		base = "ws://" + strings.TrimPrefix(base, "http://")
	}
	alloc := r.cfg.AllocationID
	if alloc == "" {
		alloc = "preflight-probe"
	}
	return base + "/api/v1/terminal?allocation_id=" + url.QueryEscape(alloc)
}

// dial opens the browser leg offering token.
func (r *run) dial(ctx context.Context, token string, res *preflight.HopResult) *websocket.Conn {
	u := r.terminalURL()
	res.Data = map[string]any{"url": u}
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		Subprotocols: []string{terminal.Subprotocol, terminal.TokenSubprotocolPrefix + token},
		HTTPHeader:   http.Header{api.HeaderCorrelationID: {r.report.CorrelationID}},
		HTTPClient:   r.cfg.HTTPClient,
	})
	switch {
	case err == nil:
		c.SetReadLimit(4 << 20)
		return c
	case resp != nil:
		res.Data["http_status"] = resp.StatusCode
		res.Fail(signal.GatewayUpgradeFailed, fmt.Sprintf("GET %s answered HTTP %d instead of a WebSocket upgrade", u, resp.StatusCode))
	case ctx.Err() != nil:
		res.Fail(signal.GatewayUpgradeFailed, fmt.Sprintf("GET %s: no upgrade answer within %s", u, r.cfg.Timeout))
	default:
		res.Fail(signal.GatewayUpgradeFailed, fmt.Sprintf("GET %s: %v", u, err))
	}
	return nil
}

// browserTerminalWS: the gateway answers the browser's WebSocket, either
// accepting the minted token (--run-ws-smoke) or refusing an invalid one
// on purpose, with a structured error frame and a 4xxx close.
func (r *run) browserTerminalWS(ctx context.Context, res *preflight.HopResult) {
	if r.cfg.RunWSSmoke && r.token != nil {
		c := r.dial(ctx, r.token.Token, res)
		if c == nil {
			return
		}
		r.ws = &wsSession{conn: c}
		r.report.SessionID = r.token.SessionID
		res.Data["session_id"] = r.token.SessionID
		if got := c.Subprotocol(); got != terminal.Subprotocol {
			res.Fail(signal.GatewayUpgradeFailed, fmt.Sprintf("the gateway echoed subprotocol %q, want %q", got, terminal.Subprotocol))
			return
		}
		res.Detail = "the gateway accepted the WebSocket for session " + r.token.SessionID
		return
	}
	c := r.dial(ctx, invalidToken, res)
	if c == nil {
		return
	}
	defer c.CloseNow()
	var got terminal.Control
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			switch {
			case errors.As(err, &ce) && got.Type == terminal.TypeError && ce.Code >= 4000 && ce.Code <= 4999:
				res.Data["error_code"], res.Data["close_code"] = string(got.Error), int(ce.Code)
				res.Detail = fmt.Sprintf("the gateway refused an invalid token on purpose: error frame %s, close %d", got.Error, ce.Code)
			case errors.As(err, &ce):
				res.Fail(signal.GatewayUpgradeFailed, fmt.Sprintf("the gateway closed with %d %q without a structured refusal (error frame %q)", ce.Code, ce.Reason, got.Error))
			case ctx.Err() != nil:
				res.Fail(signal.GatewayUpgradeFailed, fmt.Sprintf("the gateway accepted an invalid token and then sent no error frame and close within %s", r.cfg.Timeout))
			default:
				res.Fail(signal.GatewayUpgradeFailed, "reading the gateway's answer: "+err.Error())
			}
			return
		}
		if ctl, ok := controlOf(typ, msg); ok && ctl.Type == terminal.TypeError {
			got = ctl
		}
	}
}

// controlOf decodes a control frame.
func controlOf(typ websocket.MessageType, msg []byte) (terminal.Control, bool) {
	if typ != websocket.MessageBinary {
		return terminal.Control{}, false
	}
	ch, payload, err := terminal.Decode(msg)
	if err != nil || ch != terminal.ChanControl {
		return terminal.Control{}, false
	}
	ctl, err := terminal.DecodeControl(payload)
	return ctl, err == nil
}

// workloadTerminalStartup reads the session's frames until ready or an
// error frame (--run-ws-smoke), then closes the session cleanly.
func (r *run) workloadTerminalStartup(ctx context.Context, res *preflight.HopResult) {
	if !r.cfg.RunWSSmoke {
		res.Status, res.Detail = preflight.Skipped, "without --run-ws-smoke"
		return
	}
	if r.ws == nil {
		res.Status, res.Detail = preflight.Skipped, "no terminal session was opened"
		return
	}
	c := r.ws.conn
	var progress []string
	res.Data = map[string]any{"session_id": r.report.SessionID}
	for {
		fctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout+frameGrace)
		typ, msg, err := c.Read(fctx)
		cancel()
		if err != nil {
			r.ws.closed = true
			res.Data["progress"] = progress
			var ce websocket.CloseError
			switch {
			case errors.As(err, &ce) && ce.Reason != "":
				n, ok := signal.FromTerminalCode(terminal.ErrorCode(ce.Reason))
				if !ok {
					n = signal.GatewayUpgradeFailed
				}
				res.Fail(n, fmt.Sprintf("the gateway closed the session with %d %s and no error frame", ce.Code, ce.Reason))
			case errors.As(err, &ce):
				res.Fail(signal.UIConnectingStuck, fmt.Sprintf("the gateway closed the session with %d and no error frame", ce.Code))
			default:
				res.Fail(signal.UIConnectingStuck, fmt.Sprintf("no ready or error frame within %s after %v", r.cfg.Timeout+frameGrace, orStart(progress)))
			}
			return
		}
		ctl, ok := controlOf(typ, msg)
		if !ok {
			continue
		}
		switch ctl.Type {
		case terminal.TypeStatus:
			progress = append(progress, string(ctl.Progress))
		case terminal.TypeReady:
			res.Data["progress"] = progress
			res.Detail = fmt.Sprintf("session %s is ready (%s)", r.report.SessionID, strings.Join(append(progress, "ready"), " → "))
			_ = c.Close(websocket.StatusNormalClosure, "preflight done")
			r.ws.closed = true
			return
		case terminal.TypeError:
			res.Data["progress"], res.Data["error_code"] = progress, string(ctl.Error)
			n, ok := signal.FromTerminalCode(ctl.Error)
			if !ok {
				n = signal.GatewayUpgradeFailed
			}
			res.Fail(n, fmt.Sprintf("error frame %s: %s", ctl.Error, ctl.Message))
			c.CloseNow()
			r.ws.closed = true
			return
		}
	}
}

func orStart(progress []string) string {
	if len(progress) == 0 {
		return "the upgrade"
	}
	return "status " + progress[len(progress)-1]
}

// gatewayNodeStream: the gateway recorded the node's stream for the same
// session id.
func (r *run) gatewayNodeStream(ctx context.Context, res *preflight.HopResult) {
	if !r.cfg.RunWSSmoke || r.report.SessionID == "" {
		res.Status, res.Detail = preflight.Skipped, "without --run-ws-smoke"
		return
	}
	sid := r.report.SessionID
	var s api.TerminalSession
	if err := r.api.do(ctx, http.MethodGet, "/api/v1/terminal-sessions/"+url.PathEscape(sid), nil, &s); err != nil {
		res.Fail(signal.OpenWithoutStream, "read the session: "+err.Error())
		return
	}
	var states []string
	for _, st := range s.States {
		states = append(states, st.State)
	}
	res.Data = map[string]any{"session_id": sid, "states": states, "task_id": s.TaskID}
	if slices.Contains(states, string(terminal.StateNodeStreamConnected)) {
		res.Detail = fmt.Sprintf("the gateway saw the node's stream for session %s (%s)", sid, strings.Join(states, " → "))
		return
	}
	if s.TaskID != "" {
		var t api.Task
		if err := r.api.do(ctx, http.MethodGet, "/api/v1/tasks/"+url.PathEscape(s.TaskID), nil, &t); err == nil && t.State == api.TaskSucceeded {
			res.Fail(signal.OpenWithoutStream, fmt.Sprintf("terminal.open task %s succeeded but no node stream arrived for session %s", t.ID, sid))
			return
		}
	}
	if n, ok := signal.FromTerminalCode(terminal.ErrorCode(s.ErrorCode)); ok {
		res.Fail(n, fmt.Sprintf("session %s failed: %s: %s", sid, s.ErrorCode, s.ErrorMessage))
		return
	}
	res.Fail(signal.OpenWithoutStream, fmt.Sprintf("no node stream for session %s (states %s)", sid, strings.Join(states, ", ")))
}
