package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// This file drives the web console (internal/cp/webui, served at /ui/) in a
// real headless Chromium against the real control plane and a real agent:
// a login shell on a PTY as a freshly provisioned allocation user, the
// error box of a terminal that cannot open, and a TCG guest's serial
// console. The pages' own logic against a fake gateway is tested in
// internal/cp/webui; here every hop is real.

// chromiumPath is Debian's chromium (.ci/run installs it).
const chromiumPath = "/usr/bin/chromium"

// page is one headless Chromium tab.
type page struct {
	t   *testing.T
	ctx context.Context // the tab; derive per-action timeouts from it

	mu         sync.Mutex
	console    []string // console errors and uncaught exceptions, in order
	exceptions int      // uncaught exceptions among them
}

// startBrowser starts headless Chromium and returns its one tab. It skips
// the test when Chromium is missing, and fails it instead when CI=true.
func startBrowser(t *testing.T) *page {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s: %v (install the Debian package chromium; required when CI=true)", chromiumPath, err)
		}
		t.Skipf("%s: %v; skipping the browser test (install the Debian package chromium)", chromiumPath, err)
	}
	// The profile is removed after the browser is gone (cleanups run last
	// in, first out). The default options include headless.
	profile := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.NoSandbox, // tests run as root, where the sandbox refuses to start
		chromedp.DisableGPU,
		chromedp.UserDataDir(profile),
		chromedp.Env("TMPDIR="+profile), // where Chromium leaves its singleton socket's directory
		chromedp.WindowSize(1000, 700),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	logf := func(string, ...any) {}
	if os.Getenv("DROVER_TEST_LOG") != "" {
		logf = t.Logf
	}
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithLogf(logf), chromedp.WithErrorf(logf))
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	// The first Do starts the browser; it must have no deadline of its own.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromiumPath, err)
	}
	p := &page{t: t, ctx: ctx}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == "error" {
				p.mu.Lock()
				p.console = append(p.console, fmt.Sprintf("%s %s:%d %s", m.Type, m.URL, m.Line+1, m.Text))
				if m.IsException() {
					p.exceptions++
				}
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// do runs steps within d, failing the test with a dump of the page.
func (p *page) do(d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.fatalf("browser: %v", err)
	}
}

// evalJS evaluates expr in the page and decodes its value.
func evalJS[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// tryJS is evalJS that reports failure instead of failing the test.
func tryJS[T any](p *page, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// waitJS waits until expr is true in the page (a throwing expression counts
// as false: the page may still be loading).
func (p *page) waitJS(expr string, within time.Duration) {
	p.t.Helper()
	wrapped := "(() => { try { return !!(" + expr + "); } catch (e) { return false; } })()"
	deadline := time.Now().Add(within)
	for {
		ok, err := tryJS[bool](p, wrapped)
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			p.fatalf("not true within %s: %s (last error %v)", within, expr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// termJS is the live terminal of terminal.html; replayJS the player's.
const (
	termJS   = `window.droverTerm.term`
	replayJS = `window.droverReplay.term()`
)

// lines returns the text of every line of term's active buffer
// (scrollback included), trailing blanks trimmed.
func (p *page) lines(term string) []string {
	p.t.Helper()
	l, _ := tryJS[[]string](p, `(() => { const b = `+term+`.buffer.active; const out = [];
		for (let i = 0; i < b.length; i++) { const l = b.getLine(i); out.push(l ? l.translateToString(true) : ''); }
		return out; })()`)
	return l
}

// waitLine waits until a line of term matches re exactly and returns its
// submatches.
func (p *page) waitLine(term string, re *regexp.Regexp, within time.Duration) []string {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, l := range p.lines(term) {
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		}
		if time.Now().After(deadline) {
			p.fatalf("no terminal line matches %s within %s", re, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// text returns the trimmed text content of the element with id ("" when
// it does not exist).
func (p *page) text(id string) string {
	p.t.Helper()
	s, _ := tryJS[string](p, `(document.getElementById(`+strconv.Quote(id)+`) || {textContent: ''}).textContent.trim()`)
	return s
}

// typeKeys types s into the focused element, one keystroke per rune the
// way a real keyboard does: a keyDown carrying the character's text (the
// browser derives keypress and input from it) and a keyUp.
// chromedp.KeyEvent sends a separate char event after a text-less keyDown,
// which xterm.js turns into every character twice.
func (p *page) typeKeys(s string) {
	p.t.Helper()
	var steps []chromedp.Action[chromedp.Void]
	for _, r := range s {
		var down, up *input.DispatchKeyEventParams
		text := ""
		for _, k := range kb.Encode(r) {
			switch k.Type {
			case input.DispatchKeyEventTypeKeyDown:
				down = k
			case input.DispatchKeyEventTypeChar:
				text = k.Text
			case input.DispatchKeyEventTypeKeyUp:
				up = k
			}
		}
		if down == nil || up == nil {
			p.fatalf("no key events for %q", r)
		}
		if text == "" {
			down.Type = input.DispatchKeyEventTypeRawKeyDown
		}
		down.Text, down.UnmodifiedText = text, text
		for _, k := range []*input.DispatchKeyEventParams{down, up} {
			steps = append(steps, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
				_, err := cdp.Call(ctx, t, input.DispatchKeyEvent, *k)
				return err
			}))
		}
	}
	p.do(10*time.Second, steps...)
}

// fatalf fails the test with what the page shows: a screenshot (in a
// directory that outlives the test), the state, the readiness timeline,
// the error box, the terminal's last lines and console errors.
func (p *page) fatalf(format string, args ...any) {
	p.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, format, args...)
	shot := "(none)"
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		name := strings.NewReplacer("/", "_", " ", "_").Replace(p.t.Name())
		if dir, err := os.MkdirTemp("", "drover-browser-"+name+"-"); err == nil {
			shot = filepath.Join(dir, "screenshot.png")
			if err := os.WriteFile(shot, png, 0o644); err != nil {
				shot = "(" + err.Error() + ")"
			}
		}
	} else {
		shot = "(" + err.Error() + ")"
	}
	loc, _ := tryJS[string](p, `location.href`)
	fmt.Fprintf(&b, "\npage: %s\nscreenshot: %s\n#term-state: %q\n#term-timeline: %q\n#term-error: %q\n#replay-state: %q",
		loc, shot, p.text("term-state"), p.text("term-timeline"), p.text("term-error"), p.text("replay-state"))
	for _, term := range []string{termJS, replayJS} {
		if l := p.lines(term); len(l) > 0 {
			fmt.Fprintf(&b, "\n%s buffer (last lines):\n  %s", term, strings.Join(lastNonBlank(l, 15), "\n  "))
		}
	}
	p.mu.Lock()
	if len(p.console) > 0 {
		fmt.Fprintf(&b, "\nconsole errors:\n  %s", strings.Join(p.console, "\n  "))
	}
	p.mu.Unlock()
	p.t.Fatal(b.String())
}

func lastNonBlank(lines []string, n int) []string {
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	return lines[max(0, len(lines)-n):]
}

// noExceptions fails the test if a page threw an uncaught exception
// (console errors alone, such as the favicon's 404 or a refused
// WebSocket, are expected).
func (p *page) noExceptions() {
	p.t.Helper()
	p.mu.Lock()
	n := p.exceptions
	p.mu.Unlock()
	if n > 0 {
		p.fatalf("%d uncaught exceptions in the pages", n)
	}
}

// login opens the console and logs in by typing the operator token.
func (p *page) login(e *env) {
	p.t.Helper()
	p.do(15*time.Second,
		chromedp.Navigate(e.opURL+"/ui/"),
		chromedp.WaitVisible(chromedp.ID("login-token")),
		chromedp.SendKeys(chromedp.ID("login-token"), e.opToken),
		chromedp.Click(chromedp.ID("login-submit")),
	)
	p.waitJS(`!document.getElementById('app').hidden`, 10*time.Second)
}

// openTerminal clicks the allocation's "Open terminal" button on the
// allocations page and waits for terminal.html to start.
func (p *page) openTerminal(allocID string) {
	p.t.Helper()
	btn := `[data-alloc-id="` + allocID + `"] .open-terminal`
	p.waitJS(`document.querySelector('`+btn+`:not([disabled])') !== null`, 10*time.Second)
	p.do(10*time.Second, chromedp.Click(chromedp.CSS(btn)))
	p.waitJS(`location.pathname.endsWith('/ui/terminal.html') && window.droverTerm !== undefined`, 10*time.Second)
	if got := evalJS[string](p, `droverTerm.allocationId()`); got != allocID {
		p.fatalf("terminal page for allocation %q, want %q", got, allocID)
	}
}

// timeline returns the readiness hops terminal.html lists.
func (p *page) timeline() []string {
	p.t.Helper()
	return evalJS[[]string](p, `Array.from(document.querySelectorAll('#term-timeline li'), li => li.dataset.state)`)
}

// termSize returns the live terminal's columns and rows.
func (p *page) termSize() (cols, rows int) {
	p.t.Helper()
	s := evalJS[[]int](p, `[droverTerm.term.cols, droverTerm.term.rows]`)
	return s[0], s[1]
}

// recordedOutput returns the output events of a session's recording.
func (e *env) recordedOutput(s api.TerminalSession) string {
	e.t.Helper()
	var cast []byte
	if st := e.op(http.MethodGet, s.RecordingURL, nil, &cast); st != http.StatusOK {
		e.t.Fatalf("recording of %s: HTTP %d", s.ID, st)
	}
	_, evs, err := terminal.ReadCast(strings.NewReader(string(cast)))
	if err != nil {
		e.t.Fatalf("recording of %s: %v", s.ID, err)
	}
	var out strings.Builder
	for _, ev := range evs {
		if ev.Type == terminal.EventOutput {
			out.WriteString(ev.Data)
		}
	}
	return out.String()
}

// escapes matches the CSI and OSC sequences a shell prints (colours,
// bracketed paste, window titles).
var escapes = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\a\x1b]*(\a|\x1b\\)`)

// plainLines is recorded terminal output as lines of text: escape
// sequences removed, and a carriage return within a line overwriting
// what came before it (roughly what a terminal shows).
func plainLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(escapes.ReplaceAllString(out, ""), "\n") {
		l = strings.TrimSuffix(l, "\r")
		if i := strings.LastIndex(l, "\r"); i >= 0 {
			l = l[i+1:]
		}
		lines = append(lines, l)
	}
	return lines
}

// waitAllocation waits until an allocation reaches one of the states.
func (e *env) waitAllocation(id string, within time.Duration, states ...api.AllocationState) api.Allocation {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var a api.Allocation
		if st := e.op(http.MethodGet, "/api/v1/allocations/"+id, nil, &a); st != http.StatusOK {
			e.t.Fatalf("get allocation %s: HTTP %d", id, st)
		}
		if slices.Contains(states, a.State) {
			return a
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("allocation %s is %s (%s) after %s, want %v", id, a.State, a.StateReason, within, states)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// browserEnv is a control plane that records terminal sessions.
func browserEnv(t *testing.T) *env {
	return startEnv(t, openSQLite(t), func(c *server.Config) {
		c.Terminal = server.TerminalConfig{RecordingDir: t.TempDir()}
	})
}

// TestTerminalBrowserPTY is the whole chain in a real browser: log in,
// open a terminal on a host allocation whose user the agent really
// created, type a command, resize the window, exit with a code, and replay
// the recording.
func TestTerminalBrowserPTY(t *testing.T) {
	if os.Geteuid() != 0 && os.Getenv("CI") != "true" {
		t.Skip("the allocation user is created with useradd, which needs root")
	}
	p := startBrowser(t)
	e := browserEnv(t)
	bt := e.createHost("term-host")
	e.startAgent("term-host", bt.Token, agentOpts{})
	e.waitHostStatus("term-host", api.HostHealthy, 30*time.Second)

	user := fmt.Sprintf("drvt%06d", rand.IntN(1000000))
	var alloc api.Allocation
	if st := e.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: "term-host"}, &alloc); st != http.StatusCreated {
		t.Fatalf("create allocation: HTTP %d", st)
	}
	t.Cleanup(func() { // runs before the agent stops, so the user is removed
		if st := e.op(http.MethodDelete, "/api/v1/allocations/"+alloc.ID, nil, nil); st != http.StatusAccepted {
			t.Errorf("release allocation %s: HTTP %d", alloc.ID, st)
			return
		}
		e.waitAllocation(alloc.ID, 30*time.Second, api.AllocationReleased)
	})
	if a := e.waitAllocation(alloc.ID, 30*time.Second, api.AllocationActive, api.AllocationFailed); a.State != api.AllocationActive {
		t.Fatalf("allocation %s: %s", a.State, a.StateReason)
	}
	browserPTYSession(t, p, e, alloc.ID, user)
}

// browserPTYSession logs in, opens the terminal of host allocation allocID
// (user's login shell), checks output, resizes and the exit code, then the
// recording and its replay.
func browserPTYSession(t *testing.T, p *page, e *env, allocID, user string) {
	t.Helper()
	browserShellSession(t, p, e, allocID, user, "pty")
}

// browserShellSession is browserPTYSession for a session in mode (pty, or
// vm_ssh for a slice VM's brokered shell).
func browserShellSession(t *testing.T, p *page, e *env, allocID, user, mode string) {
	t.Helper()
	p.login(e)
	p.openTerminal(allocID)
	p.waitJS(`document.getElementById('term-state').textContent === 'pty_ready'`, 30*time.Second)
	if hops := p.timeline(); !isSubsequence([]string{"token_ready", "browser_ws_ready", "pty_ready"}, hops) {
		p.fatalf("readiness timeline %v lacks token_ready, browser_ws_ready, pty_ready in order", hops)
	}
	sid := evalJS[string](p, `droverTerm.sessionId()`)
	p.do(5*time.Second, chromedp.Click(chromedp.CSS("#term-container .xterm")))

	// Arithmetic expansion works in sh and bash; the typed command line
	// never equals its output.
	n := rand.IntN(1000000)
	hello := fmt.Sprintf("hello-%d", 1000000+n)
	p.typeKeys(fmt.Sprintf("echo hello-$((1000000+%d))", n) + kb.Enter)
	p.waitLine(termJS, regexp.MustCompile(`^`+hello+`$`), 15*time.Second)

	// The PTY starts at the browser's size, and follows the window.
	sizeRe := regexp.MustCompile(`^size=(\d+)x(\d+)$`)
	checkSize := func(what string) {
		t.Helper()
		cols, rows := p.termSize()
		want := fmt.Sprintf("size=%dx%d", rows, cols)
		deadline := time.Now().Add(10 * time.Second)
		for {
			p.typeKeys(`stty size | sed 's/ /x/; s/^/size=/'` + kb.Enter)
			time.Sleep(300 * time.Millisecond)
			var last string
			for _, l := range p.lines(termJS) {
				if sizeRe.MatchString(l) {
					last = l
				}
			}
			if last == want {
				return
			}
			if time.Now().After(deadline) {
				p.fatalf("%s: the PTY reports %q, the browser terminal is %d cols x %d rows (want %q)", what, last, cols, rows, want)
			}
		}
	}
	checkSize("initial size")
	cols0, rows0 := p.termSize()
	p.do(5*time.Second, chromedp.EmulateViewport(1400, 950))
	p.waitJS(fmt.Sprintf(`droverTerm.term.cols > %d && droverTerm.term.rows > %d`, cols0, rows0), 10*time.Second)
	checkSize("after the window grew")

	p.typeKeys("exit 7" + kb.Enter)
	p.waitJS(`document.getElementById('term-state').textContent === 'exited'`, 15*time.Second)
	if code := p.text("term-exit-code"); code != "7" {
		p.fatalf("#term-exit-code %q, want 7", code)
	}

	s := e.waitSessionClosed(sid, 10*time.Second)
	if s.Mode != mode || s.Username != user || s.ExitCode == nil || *s.ExitCode != 7 || s.CloseReason != "exit" {
		t.Fatalf("session %+v", s)
	}
	if states := stateNames(s); !isSubsequence([]string{"token_ready", "browser_ws_ready", "pty_ready"}, states) {
		t.Fatalf("session states %v", states)
	}
	if out := e.recordedOutput(s); !slices.Contains(plainLines(out), hello) {
		t.Fatalf("the recording lacks the line %s:\n%q", hello, out)
	}

	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/replay.html?session_id="+sid))
	p.waitJS(`['playing', 'done', 'failed'].includes(document.getElementById('replay-state').textContent)`, 10*time.Second)
	if p.text("replay-state") == "playing" {
		p.do(5*time.Second, chromedp.Click(chromedp.ID("replay-skip")))
	}
	p.waitJS(`document.getElementById('replay-state').textContent === 'done'`, 10*time.Second)
	p.waitLine(replayJS, regexp.MustCompile(`^`+hello+`$`), 5*time.Second)
	p.noExceptions()
}

// TestTerminalBrowserErrorShown: a terminal whose node has no agent fails
// at once with node_offline, and the page shows the code and its recovery
// text instead of sitting at "Connecting...".
func TestTerminalBrowserErrorShown(t *testing.T) {
	p := startBrowser(t)
	e := browserEnv(t)
	e.createHost("term-offline") // never enrolled: no agent ever connects
	e.activeAllocation("alc_offline", "term-offline", "alice")

	p.login(e)
	p.openTerminal("alc_offline")
	start := time.Now()
	p.waitJS(`['failed', 'closed', 'exited', 'pty_ready'].includes(document.getElementById('term-state').textContent)`, 10*time.Second)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the error took %s to show", took)
	}
	if st := p.text("term-state"); st != "failed" {
		p.fatalf("#term-state %q, want failed", st)
	}
	visible := evalJS[bool](p, `!document.getElementById('term-error').hidden`)
	code, recovery := p.text("term-error-code"), p.text("term-error-recovery")
	if !visible || code != string(terminal.CodeNodeOffline) || recovery != terminal.RecoveryText(terminal.CodeNodeOffline) {
		p.fatalf("error box visible=%t code %q recovery %q; want node_offline and %q", visible, code, recovery,
			terminal.RecoveryText(terminal.CodeNodeOffline))
	}
	if body := evalJS[string](p, `document.body.innerText`); strings.Contains(strings.ToLower(body), "connecting...") {
		p.fatalf("the page still says Connecting...:\n%s", body)
	}
	sid := evalJS[string](p, `droverTerm.sessionId()`)
	if s := e.waitSessionClosed(sid, 5*time.Second); s.State != "failed" || s.ErrorCode != string(terminal.CodeNodeOffline) {
		t.Fatalf("session %+v", s)
	}
	p.noExceptions()
}

func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}
