package logsgw

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/logstream"
)

// relay copies the node's frames to the client, one at a time, until the
// node's end frame, the node's stream breaks or the client goes; it always
// closes conn. With sse the client gets "event: <stream>" events and a
// final "event: end"; otherwise the lines as text and the end in the
// TrailerEnd trailer.
func (g *Gateway) relay(ctx context.Context, w http.ResponseWriter, conn *websocket.Conn, sse bool) logstream.End {
	rc := http.NewResponseController(w)
	// A stream outlives the listener's read and write timeouts.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no")
	if sse {
		h.Set("Content-Type", "text/event-stream")
	} else {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("Trailer", TrailerEnd)
	}
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()

	end := g.copyFrames(ctx, w, rc, conn, sse)
	if ctx.Err() != nil {
		// The client left: closing the node's stream closes the log there.
		_ = conn.Close(websocket.StatusGoingAway, "client_closed")
		return logstream.End{Reason: "client_closed"}
	}
	if sse {
		b, _ := json.Marshal(end)
		fmt.Fprintf(w, "event: end\ndata: %s\n\n", b)
		_ = rc.Flush()
	} else {
		v := end.Reason
		if end.Code != "" {
			v += " " + end.Code + ": " + end.Message
		}
		h.Set(TrailerEnd, sanitizeHeader(v))
	}
	_ = conn.Close(websocket.StatusNormalClosure, "")
	return end
}

// copyFrames is relay's loop. A data frame is written and flushed before
// the next is read: nothing else buffers on this hop.
func (g *Gateway) copyFrames(ctx context.Context, w io.Writer, rc *http.ResponseController, conn *websocket.Conn,
	sse bool) logstream.End {
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return logstream.End{Reason: "client_closed"}
			}
			return logstream.End{Reason: logstream.ReasonError, Code: codeStreamLost,
				Message: "the node's stream ended without an end frame: " + err.Error()}
		}
		f, err := logstream.Decode(msg)
		if err != nil || typ != websocket.MessageBinary {
			if err == nil {
				err = fmt.Errorf("%w: text message", logstream.ErrProtocol)
			}
			return logstream.End{Reason: logstream.ReasonError, Code: "logs_protocol_error", Message: err.Error()}
		}
		if f.End != nil {
			return *f.End
		}
		if sse {
			err = writeEvent(w, string(f.Stream), f.Data)
		} else {
			_, err = w.Write(f.Data)
		}
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			return logstream.End{Reason: "client_closed"}
		}
	}
}

// writeEvent writes one server-sent event whose data is line (without its
// newline; a carriage return would end the field, so it is dropped).
func writeEvent(w io.Writer, event string, line []byte) error {
	line = bytes.TrimSuffix(line, []byte{'\n'})
	line = bytes.ReplaceAll(line, []byte{'\r'}, nil)
	line = bytes.ReplaceAll(line, []byte{'\n'}, []byte{' '})
	_, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, line)
	return err
}

// sanitizeHeader keeps a trailer value to one line of printable ASCII.
func sanitizeHeader(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = ' '
		}
	}
	if len(b) > 512 {
		b = b[:512]
	}
	return string(b)
}

// NodeStream is the node's end of a log stream (nodeapi.LogsStream): the
// agent of the session's node dials it over mTLS with the nonce from
// logs.open. The stream is handed to the waiting request, and the handler
// returns when the session ends. A node may only open streams for sessions
// sent to it, each once.
func (g *Gateway) NodeStream(w http.ResponseWriter, r *http.Request, nodeID string) error {
	ctx := r.Context()
	sid := r.PathValue("session_id")
	refuse := func(status int, code, format string, args ...any) error {
		he := httpapi.Errorf(status, code, format, args...)
		if status == http.StatusForbidden {
			g.audit.Record(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "logs.node_stream", Target: sid,
				Result: code, CID: httpapi.CorrelationID(ctx), Detail: he.Message})
		}
		return he
	}
	l := g.get(sid)
	switch {
	case l == nil:
		return refuse(http.StatusNotFound, "logs_session_unknown",
			"no log stream %q waits on this control plane replica (it ended, or another replica holds it)", sid)
	case l.nodeID != nodeID:
		return refuse(http.StatusForbidden, "logs_session_wrong_node", "log stream %q was not sent to node %q", sid, nodeID)
	case subtle.ConstantTimeCompare([]byte(r.Header.Get(logstream.HeaderNonce)), []byte(l.nonce)) != 1:
		return refuse(http.StatusForbidden, "logs_nonce_mismatch", "the stream's nonce does not match log stream %q", sid)
	case !l.attached.CompareAndSwap(false, true):
		return refuse(http.StatusConflict, "logs_stream_exists", "log stream %q already has a node stream", sid)
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{logstream.Subprotocol}})
	if err != nil {
		httpapi.Logger(ctx, g.log).Warn("logs node stream upgrade", "session_id", sid, "node_id", nodeID, "err", err)
		return nil // Accept answered the request
	}
	if conn.Subprotocol() != logstream.Subprotocol {
		_ = conn.Close(websocket.StatusPolicyViolation, "subprotocol "+logstream.Subprotocol+" required")
		return nil
	}
	conn.SetReadLimit(logstream.MaxFrame)
	select {
	case l.node <- conn:
	case <-l.done:
		_ = conn.Close(websocket.StatusGoingAway, "logs_session_closed")
		return nil
	}
	<-l.done
	return nil
}
