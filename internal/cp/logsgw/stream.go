package logsgw

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Codes of refusals and stream ends.
const (
	codeLimitNode     = "logs_stream_limit_node"
	codeLimitReplica  = "logs_stream_limit_replica"
	codeNodeOffline   = "logs_node_offline"
	codeNotPlaced     = "instance_not_placed"
	codeDispatch      = "logs_dispatch_timeout"
	codeStreamTimeout = "logs_node_stream_timeout"
	codeStreamLost    = "logs_node_stream_lost"
	codeOpenFailed    = "logs_open_failed"
	// TrailerEnd is the text/plain response's trailer: how the stream
	// ended, "<reason>" or "<reason> <code>: <message>".
	TrailerEnd = "X-Drover-Logs-End"
	// retryAfter is the Retry-After (seconds) of a limit refusal.
	retryAfter = 5
)

// Query is a parsed logs request.
type Query struct {
	Follow bool
	Since  time.Time // zero: all
	Tail   int       // 0: all
	SSE    bool
}

// ParseQuery reads follow, since (RFC 3339 or a duration before now) and
// tail; SSE is chosen by Accept: text/event-stream.
func ParseQuery(r *http.Request, now time.Time) (Query, []api.FieldError) {
	q := r.URL.Query()
	var out Query
	var fe []api.FieldError
	if v := q.Get("follow"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			fe = append(fe, api.FieldError{Field: "follow", Message: "must be true or false"})
		}
		out.Follow = b
	}
	if v := q.Get("since"); v != "" {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			out.Since = t.UTC()
		} else if d, err := time.ParseDuration(v); err == nil && d > 0 {
			out.Since = now.Add(-d).UTC()
		} else {
			fe = append(fe, api.FieldError{Field: "since", Message: "must be an RFC 3339 time or a positive duration (10m, 2h)"})
		}
	}
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > task.MaxLogsTail {
			fe = append(fe, api.FieldError{Field: "tail", Message: fmt.Sprintf("must be 0-%d", task.MaxLogsTail)})
		}
		out.Tail = n
	}
	out.SSE = strings.Contains(r.Header.Get("Accept"), "text/event-stream")
	return out, fe
}

func newNonce() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// Stream is GET /api/v1/instances/{id}/logs.
func (g *Gateway) Stream(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	cid := httpapi.CorrelationID(ctx)
	q, fe := ParseQuery(r, g.now())
	refuse := func(err *httpapi.Error) error {
		g.audit.Record(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "instance.logs", Target: id, Result: err.Code,
			CID: cid, Detail: err.Message})
		return err
	}
	if fe != nil {
		he := httpapi.Invalid(fe)
		he.Code = "invalid_query"
		return refuse(he)
	}
	in, err := g.store.GetInstance(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		in, err = g.store.GetInstanceByName(ctx, id)
	}
	if err != nil {
		return httpapi.StoreError(err, "instance", id)
	}
	id = in.ID
	if in.HostID == "" {
		return refuse(httpapi.Errorf(http.StatusConflict, codeNotPlaced, "instance %q is not placed on a node yet", id))
	}
	if !g.nodes.NodeOnline(ctx, in.HostID) {
		return refuse(httpapi.Errorf(http.StatusServiceUnavailable, codeNodeOffline,
			"node %q of instance %q has no live agent connection", in.HostID, id))
	}
	l := &session{id: httpapi.NewID("ls_"), nodeID: in.HostID, nonce: newNonce(),
		node: make(chan *websocket.Conn), done: make(chan struct{})}
	if code := g.add(l); code != "" {
		what, limit := "this control plane replica", g.cfg.MaxStreams
		if code == codeLimitNode {
			what, limit = fmt.Sprintf("node %q", in.HostID), g.cfg.MaxStreamsPerNode
		}
		return refuse(&httpapi.Error{Status: http.StatusTooManyRequests, RetryAfter: retryAfter, CodedError: api.CodedError{
			Code: code, Message: fmt.Sprintf("%s already has %d open log streams; close one or retry later", what, limit)}})
	}
	defer func() {
		g.remove(l)
		close(l.done)
	}()
	lifetime := g.cfg.MaxRead
	if q.Follow {
		lifetime = g.cfg.MaxFollow
	}
	p := task.LogsOpenParams{SessionID: l.id, InstanceID: id, Nonce: l.nonce, Follow: q.Follow, Tail: q.Tail,
		MaxLifetime: api.Duration(lifetime), StreamURL: g.cfg.AdvertiseURL}
	if !q.Since.IsZero() {
		p.Since = &q.Since
	}
	pb, _ := json.Marshal(p)
	now := g.now().UTC()
	t := store.Task{ID: httpapi.NewID("tsk_"), NodeID: in.HostID, Type: task.TypeLogsOpen, Params: pb,
		State: api.TaskQueued, CorrelationID: cid, CreatedBy: httpapi.Actor(ctx),
		CreatedAt: now, ExpiresAt: now.Add(g.cfg.DispatchTimeout)}
	if err := g.tasks.Enqueue(ctx, t); err != nil {
		return fmt.Errorf("queue logs.open for instance %s: %w", id, err)
	}
	conn, he := g.wait(ctx, l, t.ID)
	if he != nil {
		g.cancelTask(ctx, t.ID)
		if ctx.Err() != nil {
			return nil // the client left
		}
		return refuse(he)
	}
	g.audit.Record(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "instance.logs", Target: id, Result: "ok",
		CID: cid, Detail: fmt.Sprintf("node=%s session=%s follow=%t tail=%d", in.HostID, l.id, q.Follow, q.Tail)})
	end := g.relay(ctx, w, conn, q.SSE)
	httpapi.Logger(ctx, g.log).Info("log stream ended", "instance_id", id, "session_id", l.id, "reason", end.Reason,
		"code", end.Code)
	return nil
}

// wait waits for the node's stream, bounded by StreamTimeout, and fails
// early when the node refuses logs.open or never picks it up.
func (g *Gateway) wait(ctx context.Context, l *session, taskID string) (*websocket.Conn, *httpapi.Error) {
	timeout := time.NewTimer(g.cfg.StreamTimeout)
	defer timeout.Stop()
	check := time.NewTicker(200 * time.Millisecond)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, httpapi.Errorf(499, "client_closed", "the client left")
		case c := <-l.node:
			return c, nil
		case <-timeout.C:
			return nil, httpapi.Errorf(http.StatusGatewayTimeout, codeStreamTimeout,
				"the node's logs stream did not reach the control plane within %s", g.cfg.StreamTimeout)
		case <-check.C:
			t, err := g.store.GetTask(ctx, taskID)
			if err != nil {
				continue
			}
			switch t.State {
			case api.TaskFailed:
				return nil, openFailure(t.Result)
			case api.TaskExpired, api.TaskCanceled:
				return nil, httpapi.Errorf(http.StatusGatewayTimeout, codeDispatch,
					"the node did not pick up logs.open within %s", g.cfg.DispatchTimeout)
			}
		}
	}
}

// openFailure maps the node's logs.open failure to the client's error.
func openFailure(result json.RawMessage) *httpapi.Error {
	var res api.TaskResult
	if json.Unmarshal(result, &res) != nil || res.Error == nil {
		return httpapi.Errorf(http.StatusBadGateway, codeOpenFailed, "logs.open failed on the node without an error")
	}
	status := http.StatusBadGateway
	switch res.Error.Code {
	case "logs_instance_unknown":
		status = http.StatusNotFound
	case "logs_unsupported":
		status = http.StatusNotImplemented
	case "logs_node_stream_limit":
		status = http.StatusTooManyRequests
	}
	return httpapi.Errorf(status, res.Error.Code, "node: %s", res.Error.Message)
}

// cancelTask cancels a logs.open nobody waits for, if still queued, with
// its task.cancel record.
func (g *Gateway) cancelTask(ctx context.Context, id string) {
	bg := context.WithoutCancel(ctx)
	if t, err := g.store.GetTask(bg, id); err != nil || t.State != api.TaskQueued {
		return
	}
	if _, err := g.store.CancelTask(bg, id, g.now().UTC(), func(t store.Task) []store.AuditEvent {
		return []store.AuditEvent{g.audit.Event(ctx, audit.Entry{Actor: "logs-gateway", Action: "task.cancel", Target: id,
			Result: "canceled", CID: t.CorrelationID, Detail: "log stream ended before a node took the task"})}
	}); err != nil &&
		!errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
		g.log.Warn("cancel logs.open", "task_id", id, "err", err)
	}
}
