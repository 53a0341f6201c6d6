package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// wsOpts customise the browser leg's upgrade request.
type wsOpts struct {
	origin    string   // default: the operator API's own origin
	protocols []string // default: terminal.ClientProtocols(token)
	query     string   // appended to the URL
	alloc     string   // allocation_id asked for (default the token's)
}

// termConn is a test browser: a WebSocket to the gateway whose frames are
// read in the background.
type termConn struct {
	t      testing.TB
	c      *websocket.Conn
	frames chan frameOrErr
	out    bytes.Buffer // stdout so far
	status []string     // status states and "ready", in order
}

type frameOrErr struct {
	ch  terminal.Channel
	p   []byte
	err error
}

func readAll(c *websocket.Conn) chan frameOrErr {
	ch := make(chan frameOrErr, 64)
	go func() {
		defer close(ch)
		for {
			_, msg, err := c.Read(context.Background())
			if err != nil {
				ch <- frameOrErr{err: err}
				return
			}
			f, p, err := terminal.Decode(msg)
			ch <- frameOrErr{ch: f, p: p, err: err}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// mintToken mints a terminal token for an allocation.
func (e *env) mintToken(allocID string, size api.TerminalTokenRequest) api.TerminalToken {
	e.t.Helper()
	var tok api.TerminalToken
	if st := e.op(http.MethodPost, "/api/v1/allocations/"+allocID+"/terminal-token", size, &tok); st != http.StatusCreated {
		e.t.Fatalf("mint terminal token for %s: HTTP %d", allocID, st)
	}
	return tok
}

// dialTerminal opens the browser leg for tok.
func (e *env) dialTerminal(tok api.TerminalToken, o wsOpts) *termConn {
	e.t.Helper()
	protos := o.protocols
	if protos == nil {
		var err error
		if protos, err = terminal.ClientProtocols(tok.Token); err != nil {
			e.t.Fatal(err)
		}
	}
	alloc := o.alloc
	if alloc == "" {
		alloc = tok.AllocationID
	}
	origin := o.origin
	if origin == "" {
		origin = e.opURL
	}
	u := "ws" + strings.TrimPrefix(e.opURL, "http") + "/api/v1/terminal?allocation_id=" + alloc + o.query
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: protos,
		HTTPHeader: http.Header{"Origin": {origin}}})
	if err != nil {
		e.t.Fatalf("dial terminal: %v (response %v)", err, resp)
	}
	if got := c.Subprotocol(); got != terminal.Subprotocol && len(protos) > 0 && protos[0] == terminal.Subprotocol {
		e.t.Fatalf("gateway echoed subprotocol %q, want %q", got, terminal.Subprotocol)
	}
	c.SetReadLimit(4 << 20)
	tc := &termConn{t: e.t, c: c, frames: readAll(c)}
	e.t.Cleanup(func() { c.CloseNow() })
	return tc
}

// next returns the next frame, failing the test after within.
func (tc *termConn) next(within time.Duration) frameOrErr {
	tc.t.Helper()
	select {
	case f, ok := <-tc.frames:
		if !ok {
			return frameOrErr{err: errors.New("connection closed")}
		}
		if f.err == nil && f.ch == terminal.ChanStdout {
			tc.out.Write(f.p)
		}
		return f
	case <-time.After(within):
		tc.t.Fatalf("no frame within %s (statuses %v, output %q)", within, tc.status, tc.out.String())
	}
	return frameOrErr{}
}

// control reads until a control message other than status/pong arrives,
// recording statuses on the way.
func (tc *termConn) control(within time.Duration) terminal.Control {
	tc.t.Helper()
	deadline := time.Now().Add(within)
	for {
		f := tc.next(time.Until(deadline))
		if f.err != nil {
			tc.t.Fatalf("read: %v (statuses %v, output %q)", f.err, tc.status, tc.out.String())
		}
		if f.ch != terminal.ChanControl {
			continue
		}
		c, err := terminal.DecodeControl(f.p)
		if err != nil {
			tc.t.Fatalf("control frame %q: %v", f.p, err)
		}
		switch c.Type {
		case terminal.TypeStatus:
			tc.status = append(tc.status, string(c.Progress))
		case terminal.TypePong:
		default:
			return c
		}
	}
}

// waitReady expects the ready frame.
func (tc *termConn) waitReady(within time.Duration) {
	tc.t.Helper()
	if c := tc.control(within); c.Type != terminal.TypeReady {
		tc.t.Fatalf("got %+v, want ready (statuses %v)", c, tc.status)
	}
	tc.status = append(tc.status, "ready")
}

// expectError expects an error frame with code, then a close with the
// code's 4xxx status and the code as reason. It returns the message.
func (tc *termConn) expectError(code terminal.ErrorCode, within time.Duration) string {
	tc.t.Helper()
	c := tc.control(within)
	if c.Type != terminal.TypeError || c.Error != code {
		tc.t.Fatalf("got %+v, want error %s (statuses %v)", c, code, tc.status)
	}
	tc.expectClose(websocket.StatusCode(terminal.CloseCode(code)), string(code), 5*time.Second)
	return c.Message
}

// expectClose reads until the connection closes with status and reason.
func (tc *termConn) expectClose(status websocket.StatusCode, reason string, within time.Duration) {
	tc.t.Helper()
	deadline := time.Now().Add(within)
	for {
		f := tc.next(time.Until(deadline))
		if f.err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(f.err, &ce) {
			tc.t.Fatalf("connection ended with %v, want close %d %q", f.err, status, reason)
		}
		if ce.Code != status || (reason != "" && ce.Reason != reason) {
			tc.t.Fatalf("closed with %d %q, want %d %q", ce.Code, ce.Reason, status, reason)
		}
		return
	}
}

// send writes a frame.
func (tc *termConn) send(ch terminal.Channel, p []byte) {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tc.c.Write(ctx, websocket.MessageBinary, terminal.Encode(ch, p)); err != nil {
		tc.t.Fatalf("write %s: %v", ch, err)
	}
}

// readUntil reads stdout until it contains sub.
func (tc *termConn) readUntil(sub string, within time.Duration) {
	tc.t.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(tc.out.String(), sub) {
		f := tc.next(time.Until(deadline))
		if f.err != nil {
			tc.t.Fatalf("read: %v; waiting for %q in %q", f.err, sub, tc.out.String())
		}
	}
}

// session reads a terminal session through the API.
func (e *env) session(id string) api.TerminalSession {
	e.t.Helper()
	var s api.TerminalSession
	if st := e.op(http.MethodGet, "/api/v1/terminal-sessions/"+id, nil, &s); st != http.StatusOK {
		e.t.Fatalf("get session %s: HTTP %d", id, st)
	}
	return s
}

// waitSessionClosed waits until the gateway recorded the session's end.
func (e *env) waitSessionClosed(id string, within time.Duration) api.TerminalSession {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := e.session(id)
		if s.ClosedAt != nil {
			return s
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("session %s not closed after %s: %+v", id, within, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func stateNames(s api.TerminalSession) []string {
	var out []string
	for _, h := range s.States {
		out = append(out, h.State)
	}
	return out
}

// activeAllocation inserts an active host allocation directly (the
// provisioning path is covered by the PTY end-to-end test).
func (e *env) activeAllocation(id, host, user string) {
	e.t.Helper()
	now := time.Now().UTC()
	if err := e.st.CreateAllocation(context.Background(), store.Allocation{ID: id, Username: user, HostID: host,
		State: api.AllocationActive, CreatedAt: now, UpdatedAt: now}); err != nil {
		e.t.Fatal(err)
	}
}

// scriptedNode is an enrolled node identity driven by the test: it
// heartbeats, claims tasks by hand and dials terminal streams, so the
// gateway's side of every hop can be checked, including misbehaviour a
// real agent would never show.
type scriptedNode struct {
	e *env
	nodeIdentity
	stop func()
}

func (e *env) scriptedNode(id string) *scriptedNode {
	e.t.Helper()
	bt := e.createHost(id)
	n := &scriptedNode{e: e, nodeIdentity: e.enroll(id, bt.Token)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.nodeURL+nodePath(id, "/heartbeat"),
				strings.NewReader(`{}`))
			if resp, err := n.client.Do(req); err == nil {
				resp.Body.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	n.stop = func() { cancel(); wg.Wait() }
	e.t.Cleanup(n.stop)
	e.waitHostStatus(id, api.HostHealthy, 5*time.Second)
	return n
}

// claim long-polls for the node's next task and returns its claims
// (decoded from the envelope; the agent's verification is tested
// elsewhere).
func (n *scriptedNode) claim(within time.Duration) api.TaskClaims {
	n.e.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		st, _, body := n.e.nodeCall(n.client, http.MethodGet, nodePath(n.id, "/tasks/wait?timeout=1s"), nil)
		if st == http.StatusNoContent {
			continue
		}
		if st != http.StatusOK {
			n.e.t.Fatalf("claim: HTTP %d %s", st, body)
		}
		var d api.TaskDelivery
		if err := json.Unmarshal(body, &d); err != nil {
			n.e.t.Fatal(err)
		}
		parts := strings.Split(d.Envelope, ".")
		raw, err := base64.RawURLEncoding.DecodeString(parts[1])
		if err != nil {
			n.e.t.Fatal(err)
		}
		var c api.TaskClaims
		if err := json.Unmarshal(raw, &c); err != nil {
			n.e.t.Fatal(err)
		}
		return c
	}
	n.e.t.Fatalf("node %s claimed nothing within %s", n.id, within)
	return api.TaskClaims{}
}

// openParams decodes a claimed terminal.open.
func openParams(t testing.TB, c api.TaskClaims) task.TerminalOpenParams {
	t.Helper()
	if c.Type != task.TypeTerminalOpen {
		t.Fatalf("claimed %s, want terminal.open", c.Type)
	}
	p, fe := task.DecodeTerminalOpenParams(c.Params)
	if fe != nil {
		t.Fatalf("terminal.open params: %v", fe)
	}
	return p
}

// result posts a task result.
func (n *scriptedNode) result(taskID string, res api.TaskResult) {
	n.e.t.Helper()
	res.FinishedAt = time.Now().UTC()
	if st, _, body := n.e.nodeCall(n.client, http.MethodPost, nodePath(n.id, "/tasks/"+taskID+"/result"), res); st != http.StatusOK {
		n.e.t.Fatalf("post result: HTTP %d %s", st, body)
	}
}

// dialStream dials the node-facing terminal stream as node pathNode with
// nonce, presenting cert (nil: no client certificate). It returns the
// connection, or the HTTP status and error code of the refusal.
func (e *env) dialStream(cert *tls.Certificate, pathNode, sid, nonce string) (*websocket.Conn, int, string) {
	e.t.Helper()
	cl := e.rawClient(cert)
	tr := cl.Transport.(*http.Transport)
	tr.ForceAttemptHTTP2 = false
	tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	if nonce != "" {
		h.Set(terminal.HeaderNonce, nonce)
	}
	c, resp, err := websocket.Dial(ctx, e.nodeURL+nodePath(pathNode, "/terminal/"+sid),
		&websocket.DialOptions{HTTPClient: cl, HTTPHeader: h, Subprotocols: []string{terminal.Subprotocol}})
	if err != nil {
		if resp == nil {
			return nil, 0, "transport: " + err.Error()
		}
		var eb api.ErrorBody
		if resp.Body != nil {
			_ = json.NewDecoder(resp.Body).Decode(&eb)
		}
		return nil, resp.StatusCode, eb.Error.Code
	}
	e.t.Cleanup(func() { c.CloseNow() })
	return c, http.StatusSwitchingProtocols, ""
}

// writeCtl writes a control frame on a node stream.
func writeCtl(t testing.TB, c *websocket.Conn, ctl terminal.Control) {
	t.Helper()
	b, err := terminal.EncodeControl(ctl)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(context.Background(), websocket.MessageBinary, terminal.Encode(terminal.ChanControl, b)); err != nil {
		t.Fatalf("node write: %v", err)
	}
}
