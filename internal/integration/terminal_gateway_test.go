package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// gatewayEnv is a control plane with short terminal deadlines and two
// scripted nodes.
func gatewayEnv(t *testing.T, st store.Store) (*env, *scriptedNode, *scriptedNode) {
	e := startEnv(t, st, func(c *server.Config) {
		c.Terminal = server.TerminalConfig{DispatchTimeout: time.Second, NodeStreamTimeout: time.Second,
			PTYTimeout: time.Second, IdleTimeout: time.Minute, KeepAlive: 5 * time.Second, RecordingDir: t.TempDir()}
	})
	return e, e.scriptedNode("node-a"), e.scriptedNode("node-b")
}

// TestTerminalGatewayChain drives the whole chain with a scripted node:
// status frames in order, the stream bound to node and nonce, the ready
// frame, both directions, exit, and what the session and audit recorded.
func TestTerminalGatewayChain(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e, a, nb := gatewayEnv(t, b.open(t))
			e.activeAllocation("alc_a", "node-a", "alice")
			tok := e.mintToken("alc_a", api.TerminalTokenRequest{Cols: 100, Rows: 30})
			if ttl := time.Until(tok.ExpiresAt); ttl > 60*time.Second || ttl <= 0 {
				t.Fatalf("token lives %s, want (0, 60s]", ttl)
			}
			br := e.dialTerminal(tok, wsOpts{})
			claims := a.claim(5 * time.Second)
			p := openParams(t, claims)
			if p.SessionID != tok.SessionID || p.Username != "alice" || p.Mode != "pty" || p.Cols != 100 || p.Rows != 30 {
				t.Fatalf("terminal.open params %+v", p)
			}
			if claims.CorrelationID == "" || claims.CorrelationID != e.session(tok.SessionID).CorrelationID {
				t.Fatalf("terminal.open correlation id %q, session's %q", claims.CorrelationID, e.session(tok.SessionID).CorrelationID)
			}

			// Node B may not take node A's session, with or without the nonce.
			if _, st, code := e.dialStream(&nb.cert, "node-b", tok.SessionID, p.Nonce); st != http.StatusForbidden || code != "terminal_session_wrong_node" {
				t.Fatalf("node B for A's session: %d %s", st, code)
			}
			if _, st, code := e.dialStream(&nb.cert, "node-a", tok.SessionID, p.Nonce); st != http.StatusForbidden || code != "node_mismatch" {
				t.Fatalf("node B under A's path: %d %s", st, code)
			}
			if !e.auditHas("terminal.node_stream", tok.SessionID, "terminal_session_wrong_node") {
				t.Error("node B's attempt is not audited")
			}
			// Node A needs the nonce.
			if _, st, code := e.dialStream(&a.cert, "node-a", tok.SessionID, strings.Repeat("0", 64)); st != http.StatusForbidden || code != "terminal_nonce_mismatch" {
				t.Fatalf("wrong nonce: %d %s", st, code)
			}
			node, st, code := e.dialStream(&a.cert, "node-a", tok.SessionID, p.Nonce)
			if node == nil {
				t.Fatalf("node A's stream refused: %d %s", st, code)
			}
			if _, st, code := e.dialStream(&a.cert, "node-a", tok.SessionID, p.Nonce); st != http.StatusConflict || code != "terminal_stream_exists" {
				t.Fatalf("second stream: %d %s", st, code)
			}
			// Before ready the browser sees progress only; keystrokes wait.
			br.send(terminal.ChanStdin, []byte("early "))
			br.send(terminal.ChanResize, terminal.EncodeResize(terminal.Size{Cols: 120, Rows: 40}))
			nodeFrames := readAll(node)
			writeCtl(t, node, terminal.Ready(tok.SessionID))
			br.waitReady(5 * time.Second)
			if want := []string{"queued", "dispatched", "node_connecting", "spawning", "ready"}; !slices.Equal(br.status, want) {
				t.Fatalf("browser saw %v, want %v", br.status, want)
			}
			// The held keystrokes, then the held resize, reach the node.
			got := map[terminal.Channel]string{}
			for len(got) < 2 {
				select {
				case f := <-nodeFrames:
					if f.err != nil {
						t.Fatalf("node read: %v", f.err)
					}
					got[f.ch] += string(f.p)
				case <-time.After(5 * time.Second):
					t.Fatalf("node got %v, want stdin and resize", got)
				}
			}
			if got[terminal.ChanStdin] != "early " || got[terminal.ChanResize] != `{"cols":120,"rows":40}` {
				t.Fatalf("node got %q", got)
			}
			// Output splits a UTF-8 character across frames; it arrives whole.
			euro := []byte("€")
			node.Write(context.Background(), websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, append([]byte("price: "), euro[:1]...)))
			node.Write(context.Background(), websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, append(euro[1:], '\n')))
			br.readUntil("price: €\n", 5*time.Second)
			writeCtl(t, node, terminal.Exit(7))
			if c := br.control(5 * time.Second); c.Type != terminal.TypeExit || c.ExitCode != 7 {
				t.Fatalf("got %+v, want exit 7", c)
			}
			br.expectClose(websocket.StatusNormalClosure, "exit", 5*time.Second)
			a.result(claims.TaskID, api.TaskResult{Status: api.ResultSucceeded})

			s := e.waitSessionClosed(tok.SessionID, 5*time.Second)
			if want := []string{"token_ready", "browser_ws_ready", "terminal_open_sent", "node_stream_connected", "pty_ready"}; !slices.Equal(stateNames(s), want) {
				t.Fatalf("session states %v, want %v", stateNames(s), want)
			}
			if s.ExitCode == nil || *s.ExitCode != 7 || s.CloseReason != "exit" || s.RecordingBytes == 0 {
				t.Fatalf("session %+v", s)
			}
			var cast []byte
			if st := e.op(http.MethodGet, s.RecordingURL, nil, &cast); st != http.StatusOK {
				t.Fatalf("recording: HTTP %d", st)
			}
			hdr, evs, err := terminal.ReadCast(strings.NewReader(string(cast)))
			if err != nil || hdr.Width != 100 || hdr.Height != 30 {
				t.Fatalf("recording header %+v, %v", hdr, err)
			}
			var out, resizes string
			for _, ev := range evs {
				switch ev.Type {
				case terminal.EventOutput:
					out += ev.Data
				case terminal.EventResize:
					resizes += ev.Data
				case terminal.EventInput:
					t.Errorf("input recorded although RecordInput is off: %q", ev.Data)
				}
			}
			if out != "price: €\n" || resizes != "120x40" {
				t.Fatalf("recorded output %q, resizes %q", out, resizes)
			}
			for _, action := range []string{"terminal.token_mint", "terminal.open", "terminal.close"} {
				var evs []api.AuditEvent
				e.op(http.MethodGet, "/api/v1/audit?correlation_id="+s.CorrelationID, nil, &evs)
				if !slices.ContainsFunc(evs, func(ev api.AuditEvent) bool { return ev.Action == action && ev.Target == s.ID }) {
					t.Errorf("no %s audit record under correlation id %s", action, s.CorrelationID)
				}
			}
			var list []api.TerminalSession
			e.op(http.MethodGet, "/api/v1/allocations/alc_a/sessions", nil, &list)
			if len(list) != 1 || list[0].ID != tok.SessionID {
				t.Fatalf("allocation sessions %+v", list)
			}
		})
	}
}

// TestTerminalTokenNegatives covers every refusal of the browser leg: each
// is an accepted upgrade, then an error frame and a 4xxx close.
func TestTerminalTokenNegatives(t *testing.T) {
	e, _, _ := gatewayEnv(t, openSQLite(t))
	e.activeAllocation("alc_1", "node-a", "alice")
	e.activeAllocation("alc_2", "node-a", "bob")
	now := time.Now().UTC()
	if err := e.st.CreateAllocation(context.Background(), store.Allocation{ID: "alc_gone", Username: "carol",
		HostID: "node-a", State: api.AllocationReleased, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}

	t.Run("slice allocation: brokered SSH into its own VM, never a host PTY", func(t *testing.T) {
		// A slice's user lives in its VM: even with a same-named user on
		// the host (alice, alc_1's), its terminal never opens a host PTY.
		// Without a running VM of its own workflow, there is no terminal.
		spec, _ := json.Marshal(api.SliceRequest{Slots: 1})
		ctx := context.Background()
		if err := e.st.CreateAllocation(ctx, store.Allocation{ID: "alc_slice", Username: "alice",
			HostID: "node-a", State: api.AllocationActive, Spec: spec, CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		var eb api.ErrorBody
		if st := e.op(http.MethodPost, "/api/v1/allocations/alc_slice/terminal-token", nil, &eb); st != http.StatusConflict || eb.Error.Code != "allocation_not_bound" {
			t.Fatalf("no workflow: HTTP %d %+v", st, eb)
		}
		plan, _ := json.Marshal(map[string]any{"vm_name": "slice-alc_slice"})
		if err := e.st.CreateSliceWorkflow(ctx, store.SliceWorkflow{AllocationID: "alc_slice", HostID: "node-a",
			Status: store.SliceFlowProvisioning, Step: "provision_vm", Spec: spec, Plan: plan, CorrelationID: "cid-slice",
			CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if st := e.op(http.MethodPost, "/api/v1/allocations/alc_slice/terminal-token", nil, &eb); st != http.StatusConflict || eb.Error.Code != "allocation_not_bound" {
			t.Fatalf("workflow not active: HTTP %d %+v", st, eb)
		}
		var list []api.TerminalSession
		if e.op(http.MethodGet, "/api/v1/allocations/alc_slice/sessions", nil, &list); len(list) != 0 {
			t.Errorf("sessions %+v, want none", list)
		}
		if _, err := e.st.UpdateSliceWorkflow(ctx, "alc_slice", func(w *store.SliceWorkflow) error {
			w.Status = store.SliceFlowActive
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var tok api.TerminalToken
		if st := e.op(http.MethodPost, "/api/v1/allocations/alc_slice/terminal-token", nil, &tok); st != http.StatusCreated || tok.NodeID != "node-a" {
			t.Fatalf("active workflow: HTTP %d %+v", st, tok)
		}
		if e.op(http.MethodGet, "/api/v1/allocations/alc_slice/sessions", nil, &list); len(list) != 1 || list[0].Mode != task.TerminalModeVMSSH {
			t.Errorf("sessions %+v, want one in mode vm_ssh", list)
		}
	})
	t.Run("mint needs an active allocation", func(t *testing.T) {
		var eb api.ErrorBody
		if st := e.op(http.MethodPost, "/api/v1/allocations/alc_gone/terminal-token", nil, &eb); st != http.StatusConflict || eb.Error.Code != "allocation_not_active" {
			t.Fatalf("HTTP %d %+v", st, eb)
		}
		if st := e.op(http.MethodPost, "/api/v1/allocations/alc_none/terminal-token", nil, &eb); st != http.StatusNotFound {
			t.Fatalf("unknown allocation: HTTP %d", st)
		}
		if st := e.op(http.MethodPost, "/api/v1/allocations/alc_1/terminal-token", api.TerminalTokenRequest{Cols: 0, Rows: 5000}, &eb); st != http.StatusUnprocessableEntity {
			t.Fatalf("bad size: HTTP %d", st)
		}
	})
	t.Run("expired", func(t *testing.T) {
		tok := e.mintToken("alc_1", api.TerminalTokenRequest{})
		if _, err := e.st.UpdateTerminalSession(context.Background(), tok.SessionID, func(s *store.TerminalSession) error {
			s.TokenExpiresAt = time.Now().Add(-time.Second)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		e.dialTerminal(tok, wsOpts{}).expectError(terminal.CodeTokenExpired, 5*time.Second)
		if s := e.session(tok.SessionID); s.State != "failed" || s.ErrorCode != "token_expired" {
			t.Fatalf("session %+v", s)
		}
	})
	t.Run("reused", func(t *testing.T) {
		tok := e.mintToken("alc_1", api.TerminalTokenRequest{})
		first := e.dialTerminal(tok, wsOpts{})
		first.control(5 * time.Second) // admitted: node-a never claims, so this is the dispatch outcome
		e.dialTerminal(tok, wsOpts{}).expectError(terminal.CodeTokenReused, 5*time.Second)
	})
	t.Run("wrong allocation", func(t *testing.T) {
		tok := e.mintToken("alc_1", api.TerminalTokenRequest{})
		e.dialTerminal(tok, wsOpts{alloc: "alc_2"}).expectError(terminal.CodeTokenWrongAllocation, 5*time.Second)
	})
	t.Run("token in the query string", func(t *testing.T) {
		tok := e.mintToken("alc_1", api.TerminalTokenRequest{})
		e.dialTerminal(tok, wsOpts{query: "&token=" + tok.Token}).expectError(terminal.CodeTokenInURL, 5*time.Second)
		// Refused before redemption: the token was not burned.
		if s := e.session(tok.SessionID); s.State != "token_ready" {
			t.Fatalf("session after a query-string attempt: %+v", s)
		}
	})
	t.Run("two token subprotocols", func(t *testing.T) {
		tok := e.mintToken("alc_1", api.TerminalTokenRequest{})
		other := e.mintToken("alc_1", api.TerminalTokenRequest{})
		e.dialTerminal(tok, wsOpts{protocols: []string{terminal.Subprotocol, terminal.TokenSubprotocolPrefix + tok.Token,
			terminal.TokenSubprotocolPrefix + other.Token}}).expectError(terminal.CodeProtocolError, 5*time.Second)
	})
	t.Run("no token", func(t *testing.T) {
		e.dialTerminal(api.TerminalToken{AllocationID: "alc_1"}, wsOpts{protocols: []string{terminal.Subprotocol}}).
			expectError(terminal.CodeTokenInvalid, 5*time.Second)
	})
	t.Run("unknown token", func(t *testing.T) {
		e.dialTerminal(api.TerminalToken{AllocationID: "alc_1", Token: "drv_term_bogus"}, wsOpts{}).
			expectError(terminal.CodeTokenInvalid, 5*time.Second)
	})
	t.Run("foreign origin", func(t *testing.T) {
		tok := e.mintToken("alc_1", api.TerminalTokenRequest{})
		e.dialTerminal(tok, wsOpts{origin: "https://evil.example"}).expectError(terminal.CodeOriginForbidden, 5*time.Second)
	})
	t.Run("allocation released after mint", func(t *testing.T) {
		tok := e.mintToken("alc_2", api.TerminalTokenRequest{})
		if st := e.op(http.MethodDelete, "/api/v1/allocations/alc_2", nil, nil); st != http.StatusAccepted {
			t.Fatalf("release: HTTP %d", st)
		}
		e.dialTerminal(tok, wsOpts{}).expectError(terminal.CodeAllocationInactive, 5*time.Second)
	})
	t.Run("allocation requests name the bad field", func(t *testing.T) {
		for _, tc := range []struct {
			req   api.CreateAllocationRequest
			field string
		}{
			{api.CreateAllocationRequest{Username: "alice"}, "host_id"},
			{api.CreateAllocationRequest{Username: "alice", HostID: "node-a", InstanceID: "i-1"}, "instance_id"},
			{api.CreateAllocationRequest{Username: "alice", HostID: "no-such-host"}, "host_id"},
			{api.CreateAllocationRequest{Username: "root", HostID: "node-a"}, "username"},
			{api.CreateAllocationRequest{Username: "Bad Name", HostID: "node-a"}, "username"},
		} {
			var eb api.ErrorBody
			if st := e.op(http.MethodPost, "/api/v1/allocations", tc.req, &eb); st != http.StatusUnprocessableEntity ||
				len(eb.Error.Fields) == 0 || eb.Error.Fields[0].Field != tc.field {
				t.Errorf("%+v: HTTP %d %+v, want 422 on %s", tc.req, st, eb.Error, tc.field)
			}
		}
	})
	t.Run("operators cannot enqueue terminal.open", func(t *testing.T) {
		var eb api.ErrorBody
		if st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: "node-a", Type: "terminal.open",
			Params: []byte(`{}`)}, &eb); st != http.StatusUnprocessableEntity || !strings.Contains(eb.Error.Message, "terminal gateway") {
			t.Fatalf("HTTP %d %+v", st, eb)
		}
	})
}

// TestTerminalDeadlines: every hop that never happens ends in its own
// error within its deadline, never an endless "Connecting...".
func TestTerminalDeadlines(t *testing.T) {
	e, a, _ := gatewayEnv(t, openSQLite(t))
	e.activeAllocation("alc_a", "node-a", "alice")
	e.createHost("node-off") // enrolled never, so never heard from
	e.activeAllocation("alc_off", "node-off", "alice")
	quiet := e.scriptedNode("node-quiet") // heartbeats, never claims
	_ = quiet
	e.activeAllocation("alc_quiet", "node-quiet", "alice")

	expect := func(t *testing.T, alloc string, code terminal.ErrorCode, within time.Duration, node func(p api.TaskClaims)) {
		t.Helper()
		tok := e.mintToken(alloc, api.TerminalTokenRequest{})
		start := time.Now()
		br := e.dialTerminal(tok, wsOpts{})
		if node != nil {
			node(a.claim(5 * time.Second))
		}
		br.expectError(code, within+3*time.Second)
		if took := time.Since(start); took > within+3*time.Second {
			t.Errorf("%s after %s, deadline %s", code, took, within)
		}
		s := e.waitSessionClosed(tok.SessionID, 5*time.Second)
		if s.State != "failed" || s.ErrorCode != string(code) {
			t.Fatalf("session %+v", s)
		}
		if !e.auditHas("terminal.open", tok.SessionID, string(code)) {
			t.Errorf("failure %s not audited", code)
		}
	}
	t.Run("node offline", func(t *testing.T) {
		expect(t, "alc_off", terminal.CodeNodeOffline, 0, nil)
	})
	t.Run("dispatch timeout", func(t *testing.T) {
		expect(t, "alc_quiet", terminal.CodeDispatchTimeout, time.Second, nil)
		// The unclaimed terminal.open is cancelled: a late agent never opens it.
		var tasks []api.Task
		e.op(http.MethodGet, "/api/v1/tasks?node_id=node-quiet", nil, &tasks)
		if len(tasks) == 0 {
			t.Fatal("no terminal.open queued for node-quiet")
		}
		for _, tk := range tasks {
			if tk.Type == "terminal.open" && !tk.State.Terminal() {
				t.Fatalf("terminal.open left %s", tk.State)
			}
			// The gateway's cancel is audited, with the task's correlation id.
			if tk.Type == "terminal.open" && !e.auditHas("task.cancel", tk.ID, "canceled") {
				t.Errorf("cancel of %s not audited", tk.ID)
			}
		}
	})
	t.Run("node stream never arrives", func(t *testing.T) {
		expect(t, "alc_a", terminal.CodeNodeStreamTimeout, time.Second, func(api.TaskClaims) {})
	})
	t.Run("open reported without a stream", func(t *testing.T) {
		expect(t, "alc_a", terminal.CodeOpenWithoutStream, 2*time.Second, func(c api.TaskClaims) {
			a.result(c.TaskID, api.TaskResult{Status: api.ResultSucceeded})
		})
	})
	t.Run("stream without a client certificate", func(t *testing.T) {
		expect(t, "alc_a", terminal.CodeNodeStreamMTLSFailed, time.Second, func(c api.TaskClaims) {
			p := openParams(t, c)
			if _, st, code := e.dialStream(nil, "node-a", p.SessionID, p.Nonce); st != http.StatusUnauthorized || code != "client_certificate_required" {
				t.Errorf("stream without a certificate: %d %s", st, code)
			}
		})
	})
	t.Run("PTY fails on the node", func(t *testing.T) {
		expect(t, "alc_a", terminal.CodePTYFailed, time.Second, func(c api.TaskClaims) {
			p := openParams(t, c)
			node, st, code := e.dialStream(&a.cert, "node-a", p.SessionID, p.Nonce)
			if node == nil {
				t.Fatalf("stream: %d %s", st, code)
			}
			writeCtl(t, node, terminal.Error(terminal.CodePTYFailed, `allocation user "alice" does not exist on this node`))
			node.Close(websocket.StatusCode(terminal.ClosePTYFailed), string(terminal.CodePTYFailed))
			a.result(c.TaskID, api.TaskResult{Status: api.ResultFailed,
				Error: &api.ResultError{Code: string(terminal.CodePTYFailed), Message: "no such user"}})
		})
	})
	t.Run("PTY never ready", func(t *testing.T) {
		expect(t, "alc_a", terminal.CodePTYFailed, time.Second, func(c api.TaskClaims) {
			p := openParams(t, c)
			if node, st, code := e.dialStream(&a.cert, "node-a", p.SessionID, p.Nonce); node == nil {
				t.Fatalf("stream: %d %s", st, code)
			}
		})
	})
}

// TestTerminalIdleAndLifetime: the gateway ends a ready session after the
// idle timeout and after the maximum lifetime, telling both legs.
func TestTerminalIdleAndLifetime(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  server.TerminalConfig
		code terminal.ErrorCode
	}{
		{"idle", server.TerminalConfig{IdleTimeout: 300 * time.Millisecond}, terminal.CodeSessionIdleTimeout},
		{"lifetime", server.TerminalConfig{MaxLifetime: 700 * time.Millisecond}, terminal.CodeSessionMaxLifetime},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEnv(t, openSQLite(t), func(c *server.Config) { c.Terminal = tc.cfg })
			a := e.scriptedNode("node-a")
			e.activeAllocation("alc_a", "node-a", "alice")
			tok := e.mintToken("alc_a", api.TerminalTokenRequest{})
			br := e.dialTerminal(tok, wsOpts{})
			p := openParams(t, a.claim(5*time.Second))
			node, _, _ := e.dialStream(&a.cert, "node-a", p.SessionID, p.Nonce)
			writeCtl(t, node, terminal.Ready(p.SessionID))
			br.waitReady(5 * time.Second)
			if tc.name == "lifetime" { // input keeps it from idling; the lifetime still ends it
				go func() {
					for i := 0; i < 20; i++ {
						br.c.Write(context.Background(), websocket.MessageBinary, terminal.Encode(terminal.ChanStdin, []byte("x")))
						time.Sleep(50 * time.Millisecond)
					}
				}()
			}
			br.expectError(tc.code, 5*time.Second)
			// The node leg is closed too, so the agent ends the shell.
			for {
				if _, _, err := node.Read(context.Background()); err != nil {
					break
				}
			}
			if s := e.waitSessionClosed(tok.SessionID, 5*time.Second); s.CloseReason != string(tc.code) {
				t.Fatalf("session %+v", s)
			}
		})
	}
}
