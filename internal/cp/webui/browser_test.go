//go:build unix

package webui

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/terminal"
)

// This file drives the pages in headless Chromium against a fake operator
// API and terminal gateway that speak internal/wire/terminal's protocol, to check
// the page logic a Go test cannot reach: readiness hops, error rendering,
// the stuck timer, stdin/resize gating and replay. Like the node lint it
// skips without a browser (the console does not need one to build or
// serve); the end-to-end test against the real server lives elsewhere.

const goodToken = "op-secret"

// fakeGateway is the fake control plane behind the pages.
type fakeGateway struct {
	mu      sync.Mutex
	resizes []terminal.Size
	stdin   []byte
}

func (g *fakeGateway) handler(t *testing.T) http.Handler {
	mux := http.NewServeMux()
	ui := Handler()
	mux.Handle("GET /ui/", ui)
	mux.Handle("GET /{$}", ui)
	auth := func(f http.HandlerFunc) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Correlation-ID", r.Header.Get("X-Correlation-ID"))
			if r.Header.Get("Authorization") != "Bearer "+goodToken {
				apiError(w, http.StatusUnauthorized, "operator_token_invalid", "operator token is not valid")
				return
			}
			f(w, r)
		})
	}
	mux.Handle("GET /api/v1/allocations", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSONBody(w, http.StatusOK, []map[string]any{
			{"id": "al_ok", "kind": "host", "username": "alice", "host_id": "h1", "state": "active"},
			{"id": "al_prov", "kind": "host", "username": "bob", "host_id": "h1", "state": "provisioning"},
			{"id": "al_vm", "kind": "instance", "username": "carol", "host_id": "h2", "instance_id": "vm1", "state": "active"},
		})
	}))
	mux.Handle("GET /api/v1/hosts", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSONBody(w, http.StatusOK, []map[string]any{{"host_id": "h1"}})
	}))
	mux.Handle("GET /api/v1/instances", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSONBody(w, http.StatusOK, []map[string]any{{"instance_id": "vm1"}})
	}))
	mux.Handle("POST /api/v1/allocations/{id}/terminal-token", auth(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if id == "al_prov" {
			apiError(w, http.StatusConflict, "allocation_not_active", "allocation al_prov is provisioning")
			return
		}
		var size terminal.Size
		_ = json.NewDecoder(r.Body).Decode(&size)
		if size.Cols == 0 || size.Rows == 0 {
			apiError(w, http.StatusUnprocessableEntity, "invalid_payload", "no size")
			return
		}
		writeJSONBody(w, http.StatusCreated, map[string]any{
			"token": "tok-" + id, "session_id": "ts_" + id, "allocation_id": id,
			"url": "/api/v1/terminal?allocation_id=" + id, "subprotocol": terminal.Subprotocol,
		})
	}))
	mux.HandleFunc("GET /api/v1/terminal", func(w http.ResponseWriter, r *http.Request) { g.terminal(t, w, r) })
	mux.Handle("GET /api/v1/allocations/{id}/sessions", auth(func(w http.ResponseWriter, r *http.Request) {
		exit := 0
		writeJSONBody(w, http.StatusOK, []map[string]any{
			{"id": "ts_2", "allocation_id": r.PathValue("id"), "state": "failed", "error_code": "node_stream_timeout",
				"created_at": "2026-01-02T03:04:05Z", "states": []map[string]any{{"state": "token_ready", "elapsed_ms": 0}}},
			{"id": "ts_1", "allocation_id": r.PathValue("id"), "state": "pty_ready", "exit_code": &exit,
				"created_at": "2026-01-02T03:00:00Z", "closed_at": "2026-01-02T03:01:00Z", "recording_bytes": 100,
				"states": []map[string]any{{"state": "token_ready", "elapsed_ms": 0}, {"state": "pty_ready", "elapsed_ms": 420}}},
		})
	}))
	mux.Handle("GET /api/v1/terminal-sessions/{sid}", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSONBody(w, http.StatusOK, map[string]any{"id": r.PathValue("sid"), "allocation_id": "al_ok", "username": "alice"})
	}))
	mux.Handle("GET /api/v1/terminal-sessions/{sid}/recording", auth(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-asciicast")
		fmt.Fprint(w, `{"version":2,"width":40,"height":10}`+"\n"+
			`[0.05,"o","first line\r\n"]`+"\n"+`[0.1,"r","50x12"]`+"\n"+`[30,"o","last line\r\n"]`+"\n")
	}))
	return mux
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	writeJSONBody(w, status, map[string]any{"error": map[string]any{"code": code, "message": msg, "correlation_id": "cid_fake"}})
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func control(ctx context.Context, c *websocket.Conn, m terminal.Control) {
	b, err := terminal.EncodeControl(m)
	if err != nil {
		panic(err)
	}
	_ = c.Write(ctx, websocket.MessageBinary, terminal.Encode(terminal.ChanControl, b))
}

// terminal is the fake gateway: the allocation id picks the scenario.
func (g *fakeGateway) terminal(t *testing.T, w http.ResponseWriter, r *http.Request) {
	alloc := r.URL.Query().Get("allocation_id")
	offered := strings.Split(r.Header.Get("Sec-WebSocket-Protocol"), ",")
	token, err := terminal.TokenFromProtocols(offered)
	c, aerr := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{terminal.Subprotocol}})
	if aerr != nil {
		t.Logf("accept: %v", aerr)
		return
	}
	ctx := r.Context()
	fail := func(code terminal.ErrorCode, msg string) {
		control(ctx, c, terminal.Error(code, msg))
		c.Close(websocket.StatusCode(terminal.CloseCode(code)), string(code))
	}
	if err != nil || token != "tok-"+alloc || r.URL.Query().Has("token") {
		fail(terminal.CodeTokenInvalid, fmt.Sprintf("bad token: %v", err))
		return
	}
	switch alloc {
	case "al_err":
		control(ctx, c, terminal.Status(terminal.ProgressQueued))
		fail(terminal.CodeNodeStreamTimeout, "node never connected")
		return
	case "al_stuck":
		control(ctx, c, terminal.Status(terminal.ProgressQueued))
		_, _, _ = c.Read(ctx) // until the browser gives up
		return
	case "al_close":
		c.Close(websocket.StatusInternalError, "")
		return
	case "al_proto":
		control(ctx, c, terminal.Status(terminal.ProgressQueued))
		_ = c.Write(ctx, websocket.MessageBinary, []byte{9, 1, 2})
		_, _, _ = c.Read(ctx)
		return
	case "al_drop":
		control(ctx, c, terminal.Ready("ts_"+alloc))
		c.Close(websocket.StatusCode(terminal.CloseNodeStream), "node_closed")
		return
	}
	for _, p := range []terminal.Progress{terminal.ProgressQueued, terminal.ProgressDispatched,
		terminal.ProgressNodeConnecting, terminal.ProgressSpawning} {
		control(ctx, c, terminal.Status(p))
	}
	control(ctx, c, terminal.Ready("ts_"+alloc))
	_ = c.Write(ctx, websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, []byte("welcome \xe2\x9c")))
	_ = c.Write(ctx, websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, []byte("\x93\r\n$ ")))
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		ch, payload, err := terminal.Decode(msg)
		if err != nil {
			fail(terminal.CodeProtocolError, err.Error())
			return
		}
		switch ch {
		case terminal.ChanStdin:
			g.mu.Lock()
			g.stdin = append(g.stdin, payload...)
			g.mu.Unlock()
			if strings.Contains(string(payload), "exit") {
				control(ctx, c, terminal.Exit(3))
				c.Close(websocket.StatusNormalClosure, "exit")
				return
			}
			_ = c.Write(ctx, websocket.MessageBinary, terminal.Encode(terminal.ChanStdout, payload))
		case terminal.ChanResize:
			s, err := terminal.DecodeResize(payload)
			if err != nil {
				fail(terminal.CodeProtocolError, err.Error())
				return
			}
			g.mu.Lock()
			g.resizes = append(g.resizes, s)
			g.mu.Unlock()
		}
	}
}

func TestBrowserPages(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("no Chromium installed; skipping the browser test (not needed to build or serve the console)")
	}
	g := &fakeGateway{}
	srv := httptest.NewServer(g.handler(t))
	defer srv.Close()
	b := startBrowser(t, bin)
	base := srv.URL + "/ui/"

	t.Run("login", func(t *testing.T) {
		b.navigate(t, base)
		b.waitJS(t, `!document.getElementById('login').hidden`)
		b.eval(t, `document.getElementById('login-token').value='wrong'; document.getElementById('login-submit').click()`)
		b.waitJS(t, `document.getElementById('login-error').textContent.includes('operator_token_invalid')`)
		b.eval(t, `document.getElementById('login-token').value='`+goodToken+`'; document.getElementById('login-submit').click()`)
		b.waitJS(t, `!document.getElementById('app').hidden && document.querySelectorAll('#alloc-rows tr').length === 3`)
		if got := b.eval(t, `[document.querySelector('[data-alloc-id="al_ok"] .open-terminal').disabled,
			document.querySelector('[data-alloc-id="al_prov"] .open-terminal').disabled,
			document.querySelector('[data-alloc-id="al_vm"] .alloc-instance').textContent,
			document.querySelector('[data-alloc-id="al_ok"] .sessions-link').getAttribute('href')].join()`); got != "false,true,vm1,sessions.html?allocation_id=al_ok" {
			t.Errorf("allocation rows: %s", got)
		}
	})
	// The pages below read the token the login left in this tab; set it
	// again in case the login subtest failed.
	b.eval(t, `sessionStorage.setItem('drover.operator_token', '`+goodToken+`')`)

	t.Run("terminal ready, input, resize, exit", func(t *testing.T) {
		b.navigate(t, base+"terminal.html?allocation_id=al_ok")
		b.waitJS(t, `window.droverTerm && droverTerm.state() === 'pty_ready'`)
		hops := b.eval(t, `Array.from(document.querySelectorAll('#term-timeline li'), li => li.dataset.state).join()`)
		if hops != "token_ready,browser_ws_ready,queued,dispatched,node_connecting,spawning,pty_ready" {
			t.Errorf("timeline %s", hops)
		}
		b.waitJS(t, `droverTerm.term.buffer.active.getLine(0).translateToString(true) === 'welcome ✓'`)
		b.eval(t, `droverTerm.term.input('echo hi\r')`)
		b.waitJS(t, `droverTerm.term.buffer.active.getLine(1).translateToString(true).includes('echo hi')`)
		// Shrinking the window must refit the terminal and send its new size.
		before := b.eval(t, `droverTerm.term.cols + 'x' + droverTerm.term.rows`)
		b.call(t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 600, "height": 400, "deviceScaleFactor": 1, "mobile": false})
		defer b.call(t, "Emulation.clearDeviceMetricsOverride", map[string]any{})
		b.waitJS(t, `droverTerm.term.cols + 'x' + droverTerm.term.rows !== `+jsString(before))
		waitFor(t, func() bool {
			now := b.eval(t, `droverTerm.term.cols + 'x' + droverTerm.term.rows`)
			g.mu.Lock()
			defer g.mu.Unlock()
			return len(g.resizes) > 0 && g.resizes[len(g.resizes)-1].String() == now
		})
		b.eval(t, `droverTerm.term.input('exit\r')`)
		b.waitJS(t, `droverTerm.state() === 'exited'`)
		if got := b.eval(t, `document.getElementById('term-exit-code').textContent + '|' + droverTerm.sessionId()`); got != "3|ts_al_ok" {
			t.Errorf("exit code|session = %s", got)
		}
	})

	tests := []struct {
		name, query, code string
		retry             bool
		extra             string // JS that must be true
	}{
		{"gateway error frame", "allocation_id=al_err", "node_stream_timeout", false,
			`document.getElementById('term-error-close').textContent.includes('4408')`},
		{"mint refused", "allocation_id=al_prov", "allocation_not_active", true,
			`document.getElementById('term-error-correlation').textContent === 'cid_fake'`},
		{"closed without a frame", "allocation_id=al_close", "terminal_gateway_closed", true,
			`document.getElementById('term-error-close').textContent.includes('1011')`},
		{"stuck", "allocation_id=al_stuck&connect_timeout_ms=1500", "terminal_ui_connecting_stuck", true,
			`droverTerm.timeline().map(h => h.state).join() === 'token_ready,browser_ws_ready,queued,failed'`},
		{"protocol error", "allocation_id=al_proto", "protocol_error", false,
			`document.getElementById('term-error-message').textContent.includes('unknown channel 9')`},
		{"connection lost after ready", "allocation_id=al_drop", "terminal_connection_lost", true,
			`document.getElementById('term-error-close').textContent.includes('4502 (node_closed)')`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b.navigate(t, base+"terminal.html?"+tt.query)
			end := "failed"
			if tt.code == "terminal_connection_lost" {
				end = "closed"
			}
			b.waitJS(t, `window.droverTerm && droverTerm.state() === '`+end+`'`)
			got := b.eval(t, `[document.getElementById('term-error-code').textContent,
				!document.getElementById('term-retry').hidden,
				document.getElementById('term-error-recovery').textContent.length > 20].join()`)
			if want := fmt.Sprintf("%s,%t,true", tt.code, tt.retry); got != want {
				t.Errorf("error box %s, want %s", got, want)
			}
			b.waitJS(t, tt.extra)
			if tt.retry {
				b.eval(t, `document.getElementById('term-retry').click()`)
				b.waitJS(t, `droverTerm.attempts() === 2 && droverTerm.state() === '`+end+`'`)
			}
		})
	}

	t.Run("401 returns to login and back", func(t *testing.T) {
		b.eval(t, `sessionStorage.setItem('drover.operator_token', 'stale')`)
		target := base + "terminal.html?allocation_id=al_ok"
		b.call(t, "Page.navigate", map[string]any{"url": target})
		b.waitJS(t, `location.pathname === '/ui/index.html' && document.readyState === 'complete' &&
			document.getElementById('login-error').textContent.includes('operator_token_invalid')`)
		b.eval(t, `document.getElementById('login-token').value='`+goodToken+`'; document.getElementById('login-submit').click()`)
		b.waitJS(t, `location.href === `+jsString(target)+` && window.droverTerm && droverTerm.state() === 'pty_ready'`)
	})

	t.Run("sessions", func(t *testing.T) {
		b.navigate(t, base+"sessions.html?allocation_id=al_ok")
		b.waitJS(t, `document.querySelectorAll('#sessions-rows tr').length === 2`)
		got := b.eval(t, `[document.querySelector('[data-session-id="ts_2"] .session-error').textContent,
			!!document.querySelector('[data-session-id="ts_2"] .replay-link'),
			document.querySelector('[data-session-id="ts_1"] .session-exit-code').textContent,
			document.querySelector('[data-session-id="ts_1"] .replay-link').getAttribute('href'),
			document.querySelectorAll('[data-session-id="ts_1"] .session-timeline li').length].join()`)
		if got != "node_stream_timeout,false,0,replay.html?session_id=ts_1,2" {
			t.Errorf("sessions rows: %s", got)
		}
	})

	t.Run("replay", func(t *testing.T) {
		b.navigate(t, base+"replay.html?session_id=ts_1")
		b.waitJS(t, `window.droverReplay && droverReplay.state() === 'playing' &&
			droverReplay.term().buffer.active.getLine(0).translateToString(true) === 'first line'`)
		b.eval(t, `document.getElementById('replay-skip').click()`)
		b.waitJS(t, `droverReplay.state() === 'done'`)
		if got := b.eval(t, `[droverReplay.term().cols, droverReplay.term().rows,
			droverReplay.term().buffer.active.getLine(1).translateToString(true)].join()`); got != "50,12,last line" {
			t.Errorf("replay end: %s", got)
		}
	})

	t.Run("no CSP violations or page errors", func(t *testing.T) {
		if errs := b.pageErrors(); len(errs) > 0 {
			t.Errorf("page errors:\n%s", strings.Join(errs, "\n"))
		}
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// browser is a headless Chromium driven over the DevTools protocol.
type browser struct {
	conn   *websocket.Conn
	ctx    context.Context
	mu     sync.Mutex
	nextID int
	waits  map[int]chan json.RawMessage
	errs   []string
}

func startBrowser(t *testing.T, bin string) *browser {
	t.Helper()
	dir, err := os.MkdirTemp("", "webui-browser-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.Command(bin, "--headless=new", "--no-sandbox", "--disable-gpu",
		"--disable-dev-shm-usage", "--no-first-run", "--remote-debugging-port=0",
		"--user-data-dir="+dir, "--window-size=1000,700", "about:blank")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its helpers end with it
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var b *browser
	t.Cleanup(func() {
		if b != nil { // ask politely, so it stops writing its profile
			msg, _ := json.Marshal(map[string]any{"id": 1 << 30, "method": "Browser.close"})
			_ = b.conn.Write(ctx, websocket.MessageText, msg)
		}
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the group of the browser started above
		<-exited
		cancel()
		_ = os.RemoveAll(dir)
	})
	var port string
	waitFor(t, func() bool {
		data, err := os.ReadFile(filepath.Join(dir, "DevToolsActivePort"))
		port, _, _ = strings.Cut(string(data), "\n")
		return err == nil && port != ""
	})
	var targets []struct {
		Type, WebSocketDebuggerURL string
	}
	waitFor(t, func() bool {
		resp, err := http.Get("http://127.0.0.1:" + port + "/json/list")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&targets) == nil && len(targets) > 0
	})
	wsURL := ""
	for _, tg := range targets {
		if tg.Type == "page" {
			wsURL = tg.WebSocketDebuggerURL
		}
	}
	conn, _, err := websocket.Dial(ctx, wsURL, nil)
	if err != nil {
		t.Fatalf("dial devtools: %v", err)
	}
	conn.SetReadLimit(64 << 20)
	b = &browser{conn: conn, ctx: ctx, waits: map[int]chan json.RawMessage{}}
	go b.readLoop()
	b.call(t, "Runtime.enable", nil)
	b.call(t, "Page.enable", nil)
	b.call(t, "Log.enable", nil)
	return b
}

func (b *browser) readLoop() {
	for {
		_, data, err := b.conn.Read(b.ctx)
		if err != nil {
			return
		}
		var m struct {
			ID     int             `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		b.mu.Lock()
		switch {
		case m.ID != 0:
			if ch := b.waits[m.ID]; ch != nil {
				if m.Error != nil {
					ch <- json.RawMessage(`{"__error":` + string(m.Error) + `}`)
				} else {
					ch <- m.Result
				}
				delete(b.waits, m.ID)
			}
		case m.Method == "Runtime.exceptionThrown",
			m.Method == "Log.entryAdded" && strings.Contains(string(m.Params), `"level":"error"`) &&
				!strings.Contains(string(m.Params), ".map"):
			b.errs = append(b.errs, string(m.Params))
		}
		b.mu.Unlock()
	}
}

func (b *browser) pageErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, e := range b.errs {
		// Failed API calls the scenarios provoke on purpose are logged by
		// the browser as network errors; they are not page faults.
		if strings.Contains(e, `"source":"network"`) {
			continue
		}
		out = append(out, e)
	}
	return out
}

func (b *browser) call(t *testing.T, method string, params any) json.RawMessage {
	t.Helper()
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan json.RawMessage, 1)
	b.waits[id] = ch
	b.mu.Unlock()
	msg, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err := b.conn.Write(b.ctx, websocket.MessageText, msg); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	select {
	case res := <-ch:
		if strings.HasPrefix(string(res), `{"__error":`) {
			t.Fatalf("%s: %s", method, res)
		}
		return res
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no answer", method)
	}
	return nil
}

func (b *browser) navigate(t *testing.T, url string) {
	t.Helper()
	b.call(t, "Page.navigate", map[string]any{"url": url})
	b.waitJS(t, `document.readyState === 'complete' && location.href === `+jsString(url))
}

// eval runs expr (a script; its completion value is the result) in the
// page and returns the value formatted with fmt.Sprint.
func (b *browser) eval(t *testing.T, expr string) string {
	t.Helper()
	res := b.call(t, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true})
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		t.Fatalf("eval %s: %v", expr, err)
	}
	if r.ExceptionDetails != nil {
		t.Fatalf("eval %s: %s %s", expr, r.ExceptionDetails.Text, r.ExceptionDetails.Exception.Description)
	}
	return fmt.Sprint(r.Result.Value)
}

// waitJS waits up to 15 s for expr to be true in the page.
func (b *browser) waitJS(t *testing.T, expr string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	last := ""
	for {
		if last = b.eval(t, "(() => { try { return !!("+expr+"); } catch (e) { return 'throws ' + e; } })()"); last == "true" {
			return
		}
		if time.Now().After(deadline) {
			state := b.eval(t, `document.body ? document.body.innerText.slice(0, 1500) : ''`)
			t.Fatalf("waiting for %s: got %s\npage text:\n%s", expr, last, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
