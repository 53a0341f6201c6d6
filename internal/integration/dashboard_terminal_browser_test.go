package integration

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// This file drives the dashboard's allocation pages (internal/cp/dashboard,
// /ui/allocations...) in a real headless Chromium: a terminal opened from
// the dashboard on a host allocation whose user a real agent created, its
// session's readiness chain and replay on the allocation page, and a
// terminal whose node never streams, failed with its signal.

// sessionChain is the readiness chain the allocation page draws for sid:
// "state:reached|missed|failed" in order.
func (p *page) sessionChain(sid string) []string {
	p.t.Helper()
	return evalJS[[]string](p, `Array.from(document.querySelectorAll('#session-`+sid+` ol.chain li'), li => li.dataset.state + ':' + li.className)`)
}

func TestDashboardTerminal(t *testing.T) {
	if os.Geteuid() != 0 && os.Getenv("CI") != "true" {
		t.Skip("the allocation user is created with useradd, which needs root")
	}
	shots := t.TempDir() // DROVER_SCREENSHOT_DIR keeps them
	if d := os.Getenv("DROVER_SCREENSHOT_DIR"); d != "" {
		shots = d
	}
	p := startBrowser(t)
	e := startEnv(t, openSQLite(t), func(c *server.Config) {
		c.Terminal = server.TerminalConfig{RecordingDir: t.TempDir(), NodeStreamTimeout: 3 * time.Second}
	})
	bt := e.createHost("dterm-host")
	e.startAgent("dterm-host", bt.Token, agentOpts{})
	quiet := e.scriptedNode("dterm-quiet") // claims terminal.open, never streams
	e.activeAllocation("alc_dterm_quiet", "dterm-quiet", "alice")
	e.waitHostStatus("dterm-host", api.HostHealthy, 30*time.Second)

	user := fmt.Sprintf("drvd%06d", rand.IntN(1000000))
	var alloc api.Allocation
	if st := e.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: "dterm-host"}, &alloc); st != http.StatusCreated {
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

	p.dashLogin(e, e.opToken)
	p.jsClick(`nav a[href="/ui/allocations"]`)
	p.waitJS(`location.pathname === '/ui/allocations' && document.getElementById('alloc-`+alloc.ID+`') !== null`, 10*time.Second)
	if st := p.text("alloc-" + alloc.ID); !strings.Contains(st, "active") || !strings.Contains(st, user) {
		t.Errorf("allocation row %q", st)
	}
	p.shot(shots, "allocations")
	p.auditA11y("allocations")

	// Open the terminal from the dashboard and run a command.
	p.jsClick(`#alloc-` + alloc.ID + ` a.open-terminal`)
	p.waitJS(`location.pathname === '/ui/allocations/`+alloc.ID+`/terminal' && window.droverTerm !== undefined`, 10*time.Second)
	p.waitJS(`document.getElementById('term-state').textContent === 'pty_ready'`, 30*time.Second)
	if hops := p.timeline(); !isSubsequence([]string{"token_ready", "browser_ws_ready", "pty_ready"}, hops) {
		p.fatalf("readiness timeline %v lacks token_ready, browser_ws_ready, pty_ready in order", hops)
	}
	sid := evalJS[string](p, `droverTerm.sessionId()`)
	p.do(5*time.Second, chromedp.Click(chromedp.CSS("#term-container .xterm")))
	p.typeKeys("echo dash-$((6*7))" + kb.Enter)
	p.waitLine(termJS, regexp.MustCompile(`^dash-42$`), 15*time.Second)
	p.shot(shots, "terminal")
	p.auditA11y("terminal")
	p.typeKeys("exit 3" + kb.Enter)
	p.waitJS(`document.getElementById('term-state').textContent === 'exited'`, 15*time.Second)
	if s := e.waitSessionClosed(sid, 10*time.Second); s.Username != user || s.ExitCode == nil || *s.ExitCode != 3 {
		t.Fatalf("session %+v", s)
	}

	// The allocation page: the session's chain up to pty_ready, its exit
	// code, and a Replay link that plays the recording.
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/allocations/"+alloc.ID))
	p.waitJS(`document.getElementById('session-`+sid+`') !== null`, 10*time.Second)
	chain := p.sessionChain(sid)
	if len(chain) == 0 || chain[len(chain)-1] != "pty_ready:reached" || !isSubsequence([]string{"token_ready:reached", "browser_ws_ready:reached"}, chain) {
		t.Errorf("readiness chain %v, want it to end in pty_ready reached", chain)
	}
	if got := evalJS[string](p, `document.querySelector('#session-`+sid+` .s-exit').textContent`); got != "3" {
		t.Errorf("exit code %q", got)
	}
	if pv := evalJS[string](p, `document.getElementById('alloc-provision').textContent`); pv == "" {
		t.Error("no provision task link")
	}
	p.shot(shots, "allocation")
	p.auditA11y("allocation")
	p.jsClick(`#session-` + sid + ` a.replay`)
	p.waitJS(`location.pathname === '/ui/sessions/`+sid+`/replay' && ['playing', 'done', 'failed'].includes(document.getElementById('replay-state').textContent)`, 10*time.Second)
	if p.text("replay-state") == "playing" {
		p.jsClick("#replay-skip")
	}
	p.waitJS(`document.getElementById('replay-state').textContent === 'done'`, 10*time.Second)
	p.waitLine(replayJS, regexp.MustCompile(`^dash-42$`), 5*time.Second)
	p.shot(shots, "replay")
	p.auditA11y("replay")

	// A node that takes terminal.open but never streams: the terminal page
	// ends in a structured error, and the allocation page shows the
	// session failed with its signal.
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/allocations/alc_dterm_quiet/terminal"))
	quiet.claim(10 * time.Second)
	p.waitJS(`['failed', 'closed', 'exited', 'pty_ready'].includes(document.getElementById('term-state').textContent)`, 10*time.Second)
	if st, code, sig := p.text("term-state"), p.text("term-error-code"), p.text("term-error-signal"); st != "failed" ||
		code != string(terminal.CodeNodeStreamTimeout) || sig != "terminal_node_stream_timeout" {
		p.fatalf("terminal page: state %q code %q signal %q", st, code, sig)
	}
	if cid := p.text("term-error-correlation"); cid == "" || cid == "(none)" {
		t.Errorf("no correlation id in the error box")
	}
	p.shot(shots, "terminal-failed")
	p.auditA11y("terminal-failed")
	qsid := evalJS[string](p, `droverTerm.sessionId()`)
	if s := e.waitSessionClosed(qsid, 5*time.Second); s.State != "failed" || s.Signal != "terminal_node_stream_timeout" {
		t.Fatalf("session %+v", s)
	}
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/allocations/alc_dterm_quiet"))
	p.waitJS(`document.getElementById('session-`+qsid+`') !== null`, 10*time.Second)
	if chain := p.sessionChain(qsid); len(chain) == 0 || chain[len(chain)-1] != "failed:failed" {
		t.Errorf("failed session's chain %v", chain)
	}
	if sig := evalJS[string](p, `document.querySelector('#session-`+qsid+` .s-signal').textContent`); sig != "terminal_node_stream_timeout" {
		t.Errorf("signal on the allocation page %q", sig)
	}
	p.shot(shots, "allocation-failed")
	p.auditA11y("allocation-failed")
	p.noExceptions()
}
