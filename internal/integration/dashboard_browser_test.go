package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
)

// This file drives the server-rendered dashboard (internal/cp/dashboard:
// /ui/login, /ui/fleet, /ui/hosts/{id}) in a real headless Chromium against
// the real control plane and two real agents.

// dashLogin logs in on /ui/login with tok and waits for the fleet page.
func (p *page) dashLogin(e *env, tok string) {
	p.t.Helper()
	p.do(15*time.Second,
		chromedp.Navigate(e.opURL+"/ui/login"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), tok),
		chromedp.Click(chromedp.ID("login")),
	)
	p.waitJS(`location.pathname === '/ui/fleet' && document.getElementById('fleet').dataset.live === '1'`, 10*time.Second)
}

// jsClick clicks the element sel names (a link navigates, a submit
// button submits its form) from JavaScript. Actions through chromedp's
// DOM node ids can fail with "No node with given id found" right after a
// navigation that a click started (chromedp may still hold the old
// document's node ids); a script always runs in the current document.
func (p *page) jsClick(sel string) {
	p.t.Helper()
	if !evalJS[bool](p, `(() => { const e = document.querySelector(`+strconv.Quote(sel)+`); if (!e) return false; e.click(); return true; })()`) {
		p.fatalf("click %s: no such element", sel)
	}
}

// jsSet sets the value of the input or select sel names, as typing or
// choosing would (input and change events), from JavaScript (see jsClick).
func (p *page) jsSet(sel, value string) {
	p.t.Helper()
	if !evalJS[bool](p, `(() => { const e = document.querySelector(`+strconv.Quote(sel)+`); if (!e) return false; e.value = `+strconv.Quote(value)+`;
		e.dispatchEvent(new Event('input', {bubbles: true})); e.dispatchEvent(new Event('change', {bubbles: true})); return true; })()`) {
		p.fatalf("set %s: no such element", sel)
	}
}

// shot saves a screenshot of the page as dir/name.png.
func (p *page) shot(dir, name string) {
	p.t.Helper()
	// A page still loading (after a click that navigated) can have no
	// layout yet: "Cannot take screenshot with 0 width".
	p.waitJS(`document.readyState === 'complete' && document.documentElement.getBoundingClientRect().width > 0`, 10*time.Second)
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Errorf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Error(err)
	}
	p.t.Logf("screenshot: %s", path)
}

// postStatus POSTs form fields from the page (fetch, same origin, the
// session cookie) and returns the HTTP status.
func (p *page) postStatus(path string, fields map[string]string) int {
	p.t.Helper()
	var b strings.Builder
	for k, v := range fields {
		fmt.Fprintf(&b, "body.set(%q, %q);", k, v)
	}
	evalJS[bool](p, `(() => { window.__st = 0; const body = new URLSearchParams(); `+b.String()+
		`fetch(`+fmt.Sprintf("%q", path)+`, {method: 'POST', body, redirect: 'manual'}).then(r => { window.__st = r.status || 1; }); return true; })()`)
	p.waitJS(`window.__st !== 0`, 10*time.Second)
	return evalJS[int](p, `window.__st`)
}

func TestDashboardBrowser(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	shots := t.TempDir() // DROVER_SCREENSHOT_DIR keeps them
	if d := os.Getenv("DROVER_SCREENSHOT_DIR"); d != "" {
		shots = d
	}
	for _, h := range []struct{ id, accel string }{{"dash-a", "tcg"}, {"dash-b", "kvm"}} {
		bt := e.createHost(h.id)
		e.startAgent(h.id, bt.Token, agentOpts{accel: h.accel})
	}
	bt := e.createHost("dash-c")
	_, stopC := e.startAgent("dash-c", bt.Token, agentOpts{accel: "tcg"})
	for _, id := range []string{"dash-a", "dash-b", "dash-c"} {
		e.waitHostStatus(id, api.HostHealthy, 15*time.Second)
	}
	viewer, err := e.srv.CreateOperatorToken(context.Background(), server.OperatorTokenSpec{Name: "dash-viewer", Role: api.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}

	p := startBrowser(t)
	p.dashLogin(e, e.opToken)
	cell := func(id, class string) string {
		return fmt.Sprintf(`document.querySelector('#host-%s .%s').textContent`, id, class)
	}
	p.waitJS(cell("dash-a", "status")+`.startsWith('healthy') && `+cell("dash-b", "status")+`.startsWith('healthy')`, 5*time.Second)
	for id, want := range map[string]string{"dash-a": "tcg works", "dash-b": "kvm not working"} {
		if got := strings.TrimSpace(evalJS[string](p, cell(id, "accel"))); got != want {
			t.Errorf("%s accelerator cell %q, want %q", id, got, want)
		}
		if got := evalJS[string](p, cell(id, "os")); got != "linux" {
			t.Errorf("%s os cell %q", id, got)
		}
	}
	if n := evalJS[int](p, `document.querySelectorAll('#host-dash-a svg rect').length`); n != 2 {
		t.Errorf("heartbeat age bar: %d rects", n)
	}
	p.shot(shots, "fleet")

	// A host that stops heartbeating turns stale on screen without a
	// reload: stale after 3 intervals, shown within 3 more.
	evalJS[bool](p, `window.__sameDocument = true`)
	stopC()
	p.waitJS(cell("dash-c", "status")+`.startsWith('stale')`, 3*harnessHeartbeat+3*harnessHeartbeat+time.Second)
	if !evalJS[bool](p, `window.__sameDocument === true`) {
		t.Error("the fleet page reloaded")
	}
	p.shot(shots, "fleet-stale")

	// Filters: status=stale shows only dash-c.
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/fleet?status=stale"))
	p.waitJS(`document.querySelectorAll('#fleet-rows tr').length === 1 && document.getElementById('host-dash-c')`, 5*time.Second)

	// Host page: run a health probe (the action form, boosted by htmx).
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/hosts/dash-a"), chromedp.WaitVisible(chromedp.ID("act-health-probe")))
	if st := p.postStatus("/ui/hosts/dash-a/actions/drain", nil); st != 403 {
		t.Errorf("operator POST without CSRF: %d, want 403", st)
	}
	if !evalJS[bool](p, `!!window.htmx && !!document.querySelector('#act-health-probe').form._htmx`) {
		t.Error("htmx did not load or did not boost the action forms")
	}
	p.jsClick("#act-health-probe")
	p.waitJS(`document.getElementById('action-done').textContent.startsWith('health probe queued: task ')`, 10*time.Second)
	done := evalJS[string](p, `document.getElementById('action-done').textContent`)
	task := e.waitTask(strings.TrimPrefix(done, "health probe queued: task "), 15*time.Second)
	if task.State != api.TaskSucceeded || task.Type != "diag.health_probe" {
		t.Errorf("health probe task: %+v", task)
	}
	p.shot(shots, "host")

	// Rotate the bootstrap token: shown once with the agent's env, on that
	// answer only; the host page does not show it again.
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/hosts/dash-a"), chromedp.WaitVisible(chromedp.ID("act-rotate-token")))
	p.jsClick("#act-rotate-token")
	p.waitJS(`!!document.getElementById('agent-env')`, 10*time.Second)
	envText := evalJS[string](p, `document.getElementById('agent-env').textContent`)
	_, tok, _ := strings.Cut(envText, "NODE_AGENT_BOOTSTRAP_TOKEN=")
	tok, _, _ = strings.Cut(tok, "\n")
	if len(strings.TrimSpace(tok)) < 16 {
		t.Fatalf("the token page shows no bootstrap token: %q", envText)
	}
	p.shot(shots, "token")
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/hosts/dash-a"), chromedp.WaitVisible(chromedp.ID("host-status")))
	if evalJS[bool](p, `document.documentElement.outerHTML.includes(`+strconv.Quote(strings.TrimSpace(tok))+`)`) {
		t.Error("the host page shows the rotated token again")
	}

	// Download the health probe's evidence bundle through the dashboard:
	// a gzip tar with its manifest.
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	bundle, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch('/ui/evidence/`+task.CorrelationID+`')
		.then(r => r.ok ? r.arrayBuffer() : Promise.reject('HTTP ' + r.status))
		.then(b => { let s = ''; new Uint8Array(b).forEach(c => s += String.fromCharCode(c)); return btoa(s); })`, chromedp.EvalAwaitPromise))
	cancel()
	if err != nil {
		t.Fatalf("download the evidence bundle: %v", err)
	}
	checkEvidenceBundle(t, bundle, task.CorrelationID)

	// Logout, then a viewer: no action controls, and a forged POST with
	// the viewer's valid CSRF token is refused.
	p.jsClick(`header form button`)
	p.waitJS(`location.pathname === '/ui/login'`, 10*time.Second)
	p.dashLogin(e, viewer.Token)
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/hosts/dash-a"), chromedp.WaitVisible(chromedp.ID("host-status")))
	if n := evalJS[int](p, `document.querySelectorAll('main form, main button').length`); n != 0 {
		t.Errorf("viewer's host page has %d action controls", n)
	}
	csrf := evalJS[string](p, `document.querySelector('header input[name=csrf]').value`)
	if st := p.postStatus("/ui/hosts/dash-a/actions/drain", map[string]string{"csrf": csrf}); st != 403 {
		t.Errorf("viewer's forged drain: %d, want 403", st)
	}
	p.shot(shots, "host-viewer")

	// A 390 px phone: the page does not scroll sideways (the fleet table
	// scrolls in its own box).
	p.do(10*time.Second, chromedp.EmulateViewport(390, 844), chromedp.Navigate(e.opURL+"/ui/fleet"))
	p.waitJS(`document.getElementById('host-dash-a')`, 5*time.Second)
	if w := evalJS[int](p, `document.documentElement.scrollWidth`); w > 390 {
		t.Errorf("fleet page is %d px wide on a 390 px phone", w)
	}
	p.shot(shots, "fleet-phone")
	var h api.Host
	e.op("GET", "/api/v1/hosts/dash-a", nil, &h)
	if h.Draining {
		t.Error("dash-a is draining after the refused POSTs")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.console {
		if !strings.Contains(c, "403") {
			t.Errorf("console: %s", c)
		}
	}
}

// checkEvidenceBundle decodes a base64 evidence bundle and checks it is a
// gzip tar whose manifest names cid.
func checkEvidenceBundle(t *testing.T, b64 string, cid string) {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("evidence download: %.200s (%v)", b64, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("evidence bundle is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("evidence bundle tar: %v", err)
		}
		names = append(names, hdr.Name)
		if hdr.Name == "manifest.json" {
			m, _ := io.ReadAll(tr)
			if !bytes.Contains(m, []byte(cid)) {
				t.Errorf("manifest lacks %s: %s", cid, m)
			}
		}
	}
	if !slices.Contains(names, "manifest.json") || !slices.Contains(names, "tasks.json") {
		t.Errorf("evidence bundle holds %v", names)
	}
}
