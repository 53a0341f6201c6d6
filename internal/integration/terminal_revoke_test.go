package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// revokeWithin is the deadline for a live session to end after what
// authorised it went away.
const revokeWithin = 5 * time.Second

// terminalCfg are gateway settings for sessions that stay open while a test
// acts on them.
func terminalCfg(mutate ...func(*server.TerminalConfig)) func(*server.Config) {
	return func(c *server.Config) {
		c.Terminal = server.TerminalConfig{DispatchTimeout: 10 * time.Second, NodeStreamTimeout: 5 * time.Second,
			PTYTimeout: 5 * time.Second, IdleTimeout: time.Minute, KeepAlive: 5 * time.Second}
		for _, m := range mutate {
			m(&c.Terminal)
		}
	}
}

// opAs calls the operator API with token; it returns the status, the
// Retry-After header and decodes the answer into out.
func (e *env) opAs(token, method, path string, in, out any) (int, string) {
	e.t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.opURL+path, body)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := e.opHTTP.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// liveTerminal is a session spliced between a test browser and a scripted
// node.
type liveTerminal struct {
	br   *termConn
	node *websocket.Conn
	tok  api.TerminalToken
}

// openLive opens a terminal for tok through node n and waits for ready.
func (e *env) openLive(n *scriptedNode, tok api.TerminalToken) liveTerminal {
	e.t.Helper()
	br := e.dialTerminal(tok, wsOpts{})
	p := openParams(e.t, n.claim(5*time.Second))
	node, st, code := e.dialStream(&n.cert, n.id, tok.SessionID, p.Nonce)
	if node == nil {
		e.t.Fatalf("node stream refused: %d %s", st, code)
	}
	writeCtl(e.t, node, terminal.Ready(tok.SessionID))
	br.waitReady(5 * time.Second)
	return liveTerminal{br: br, node: node, tok: tok}
}

// alive checks the session still carries output.
func (lt liveTerminal) alive(t *testing.T, marker string) {
	t.Helper()
	if err := lt.node.Write(context.Background(), websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, []byte(marker))); err != nil {
		t.Fatalf("node write: %v", err)
	}
	lt.br.readUntil(marker, 5*time.Second)
}

// expectRevoked: the browser gets the error frame and the code's close
// within revokeWithin, the node's stream is closed, and the session record
// says why.
func (e *env) expectRevoked(lt liveTerminal, code terminal.ErrorCode) {
	e.t.Helper()
	nodeFrames := readAll(lt.node)
	start := time.Now()
	msg := lt.br.expectError(code, revokeWithin)
	if d := time.Since(start); d > revokeWithin {
		e.t.Fatalf("session ended %s after the revocation, want within %s", d, revokeWithin)
	}
	deadline := time.After(revokeWithin)
	for closed := false; !closed; {
		select {
		case f := <-nodeFrames:
			closed = f.err != nil
		case <-deadline:
			e.t.Fatal("the node's stream was not closed")
		}
	}
	s := e.waitSessionClosed(lt.tok.SessionID, revokeWithin)
	if s.ErrorCode != string(code) || s.ErrorMessage != msg || s.CloseReason != string(code) {
		e.t.Fatalf("session record %+v, want error and close reason %s", s, code)
	}
}

// TestTerminalRevocation: a live session ends within 5 s, with an error
// frame and a 4xxx close, when its host is revoked or disabled, when its
// allocation is released, or when the operator token that minted it is
// revoked; sessions that depend on none of these stay open. On PostgreSQL
// every revocation is made on a second replica, so it reaches the replica
// holding the session through LISTEN/NOTIFY.
func TestTerminalRevocation(t *testing.T) {
	for _, b := range []string{"sqlite", "postgres"} {
		t.Run(b, func(t *testing.T) {
			var e, actor *env
			switch b {
			case "sqlite":
				e = startEnv(t, openSQLite(t), terminalCfg())
				actor = e
			case "postgres":
				if pg == nil {
					pgtest.Skip(t, pgErr)
				}
				dsn := pg.NewDatabase(t)
				e = startEnv(t, openPostgresDSN(t, dsn), terminalCfg())
				actor = startEnv(t, openPostgresDSN(t, dsn))
			}
			nodes := map[string]*scriptedNode{}
			for _, id := range []string{"node-rev", "node-dis", "node-rel", "node-tok"} {
				nodes[id] = e.scriptedNode(id)
				e.activeAllocation("alc-"+id, id, "alice")
			}
			other := e.openLive(nodes["node-tok"], e.mintToken("alc-node-tok", api.TerminalTokenRequest{}))

			t.Run("host revoked", func(t *testing.T) {
				lt := e.openLive(nodes["node-rev"], e.mintToken("alc-node-rev", api.TerminalTokenRequest{}))
				if st := actor.op(http.MethodPost, "/api/v1/hosts/node-rev/revoke", nil, nil); st != http.StatusOK {
					t.Fatalf("revoke host: HTTP %d", st)
				}
				e.expectRevoked(lt, terminal.CodeTerminalRevoked)
			})
			t.Run("host disabled", func(t *testing.T) {
				lt := e.openLive(nodes["node-dis"], e.mintToken("alc-node-dis", api.TerminalTokenRequest{}))
				if st := actor.op(http.MethodPost, "/api/v1/hosts/node-dis/disable", nil, nil); st != http.StatusOK {
					t.Fatalf("disable host: HTTP %d", st)
				}
				e.expectRevoked(lt, terminal.CodeTerminalRevoked)
			})
			t.Run("allocation released", func(t *testing.T) {
				lt := e.openLive(nodes["node-rel"], e.mintToken("alc-node-rel", api.TerminalTokenRequest{}))
				if st := actor.op(http.MethodDelete, "/api/v1/allocations/alc-node-rel", nil, nil); st != http.StatusAccepted {
					t.Fatalf("release allocation: HTTP %d", st)
				}
				e.expectRevoked(lt, terminal.CodeAllocationInactive)
			})
			t.Run("minting token revoked", func(t *testing.T) {
				minter, err := e.srv.CreateOperatorToken(context.Background(),
					server.OperatorTokenSpec{Name: "minter", Role: api.RoleOperator})
				if err != nil {
					t.Fatal(err)
				}
				var tok api.TerminalToken
				if st, _ := e.opAs(minter.Token, http.MethodPost, "/api/v1/allocations/alc-node-tok/terminal-token",
					api.TerminalTokenRequest{}, &tok); st != http.StatusCreated {
					t.Fatalf("mint with the minter token: HTTP %d", st)
				}
				lt := e.openLive(nodes["node-tok"], tok)
				if st := actor.op(http.MethodPost, "/api/v1/tokens/"+minter.ID+"/revoke", nil, nil); st != http.StatusNoContent {
					t.Fatalf("revoke token: HTTP %d", st)
				}
				e.expectRevoked(lt, terminal.CodeTerminalRevoked)
			})
			// The same node and allocation, minted by a token that was not
			// revoked: still open.
			other.alive(t, "still open\n")
		})
	}
}

// TestTerminalRevokedWithoutEvent: a revocation whose change event never
// reaches the replica (here: made through a second store handle, whose
// in-process events the replica does not see) still ends the session, by
// the periodic recheck.
func TestTerminalRevokedWithoutEvent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "drover.db")
	open := func() store.Store {
		st, err := sqlite.Open(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	e := startEnv(t, open(), terminalCfg(func(tc *server.TerminalConfig) { tc.RecheckInterval = 300 * time.Millisecond }))
	side := open()
	n := e.scriptedNode("node-a")
	e.activeAllocation("alc-a", "node-a", "alice")
	lt := e.openLive(n, e.mintToken("alc-a", api.TerminalTokenRequest{}))
	if _, err := side.UpdateHost(context.Background(), "node-a", func(h *store.Host) error {
		h.Revoked, h.Enabled = true, false
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.expectRevoked(lt, terminal.CodeTerminalRevoked)
}

// TestTerminalSessionLimit: a node may have MaxSessionsPerNode live
// sessions on a gateway. One more is refused at the mint (429
// terminal_session_limit with Retry-After) and, for a token minted before
// the cap was reached, at the WebSocket (error frame and close 4429)
// instead of hanging. Other nodes are not affected, and a slot is free
// again once a session ends.
func TestTerminalSessionLimit(t *testing.T) {
	e := startEnv(t, openSQLite(t), terminalCfg(func(tc *server.TerminalConfig) { tc.MaxSessionsPerNode = 2 }))
	e.scriptedNode("node-a")
	e.scriptedNode("node-b")
	e.activeAllocation("alc-a", "node-a", "alice")
	e.activeAllocation("alc-b", "node-b", "bob")
	toks := make([]api.TerminalToken, 3)
	for i := range toks {
		toks[i] = e.mintToken("alc-a", api.TerminalTokenRequest{})
	}
	queued := func(tc *termConn) {
		t.Helper()
		for len(tc.status) == 0 {
			f := tc.next(5 * time.Second)
			if f.err != nil {
				t.Fatalf("read: %v", f.err)
			}
			if c, err := terminal.DecodeControl(f.p); err == nil && c.Type == terminal.TypeStatus {
				tc.status = append(tc.status, string(c.Progress))
			}
		}
		if tc.status[0] != string(terminal.ProgressQueued) {
			t.Fatalf("statuses %v, want queued first", tc.status)
		}
	}
	first := e.dialTerminal(toks[0], wsOpts{})
	queued(first)
	queued(e.dialTerminal(toks[1], wsOpts{}))

	msg := e.dialTerminal(toks[2], wsOpts{}).expectError(terminal.CodeSessionLimit, 5*time.Second)
	if s := e.waitSessionClosed(toks[2].SessionID, 5*time.Second); s.ErrorCode != string(terminal.CodeSessionLimit) {
		t.Fatalf("refused session record %+v (message %q)", s, msg)
	}
	var eb api.ErrorBody
	st, after := e.opAs(e.opToken, http.MethodPost, "/api/v1/allocations/alc-a/terminal-token", api.TerminalTokenRequest{}, &eb)
	if st != http.StatusTooManyRequests || eb.Error.Code != "terminal_session_limit" || after == "" || !eb.Error.Retryable {
		t.Fatalf("mint at the cap: %d %+v Retry-After %q, want 429 terminal_session_limit, retryable, with Retry-After", st, eb.Error, after)
	}
	queued(e.dialTerminal(e.mintToken("alc-b", api.TerminalTokenRequest{}), wsOpts{}))

	// The browser leaving ends its session and frees its slot.
	first.c.Close(websocket.StatusNormalClosure, "bye")
	e.waitSessionClosed(toks[0].SessionID, 5*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	var tok api.TerminalToken
	for {
		st, _ := e.opAs(e.opToken, http.MethodPost, "/api/v1/allocations/alc-a/terminal-token", api.TerminalTokenRequest{}, &tok)
		if st == http.StatusCreated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mint after a session ended: HTTP %d", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	queued(e.dialTerminal(tok, wsOpts{}))
	if got := e.metric(`drover_limit_refusals_total{code="terminal_session_limit"}`); got != 2 {
		t.Fatalf("terminal_session_limit refusals = %g, want 2", got)
	}
}
