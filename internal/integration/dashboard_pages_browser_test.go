package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestDashboardTasksAuditBrowser drives /ui/tasks, /ui/tasks/{id} and
// /ui/audit in a real headless Chromium against the real control plane and
// a real agent.
func TestDashboardTasksAuditBrowser(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	shots := t.TempDir() // DROVER_SCREENSHOT_DIR keeps them
	if d := os.Getenv("DROVER_SCREENSHOT_DIR"); d != "" {
		shots = d
	}
	bt := e.createHost("dash-t")
	e.startAgent("dash-t", bt.Token, agentOpts{accel: "tcg"})
	e.waitHostStatus("dash-t", api.HostHealthy, 15*time.Second)
	var probe, echo api.Task
	if st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: "dash-t", Type: "diag.health_probe",
		CorrelationID: "dash-probe-cid"}, &probe); st != http.StatusCreated {
		t.Fatalf("enqueue probe: %d", st)
	}
	if st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: "dash-t", Type: "diag.echo",
		Params: json.RawMessage(`{"message":"<b>hi</b>"}`)}, &echo); st != http.StatusCreated {
		t.Fatalf("enqueue echo: %d", st)
	}
	if got := e.waitTask(probe.ID, 20*time.Second); got.State != api.TaskSucceeded || len(got.Result.Timings) == 0 {
		t.Fatalf("probe: %+v", got)
	}
	e.waitTask(echo.ID, 20*time.Second)

	p := startBrowser(t)
	p.dashLogin(e, e.opToken)
	p.jsClick(`header nav a[href="/ui/tasks"]`)
	p.waitJS(`location.pathname === '/ui/tasks' && document.querySelectorAll('#task-list tbody tr[data-type]').length >= 2`, 10*time.Second)
	// Filter by type with the form (keyboard-reachable select and button).
	p.jsSet("#f-type", "diag.health_probe")
	p.jsClick("#task-filter")
	p.waitJS(`location.search.includes('type=diag.health_probe') && document.querySelectorAll('#task-list tbody tr[data-type]').length >= 1`, 10*time.Second)
	if n := evalJS[int](p, `[...document.querySelectorAll('#task-list tbody tr[data-type]')].filter(r => r.dataset.type !== 'diag.health_probe').length`); n != 0 {
		t.Errorf("type filter shows %d other tasks", n)
	}
	if !evalJS[bool](p, `document.querySelector('label[for=f-type]') !== null && document.querySelector('label[for=f-state]') !== null`) {
		t.Error("filters are not labelled")
	}
	p.shot(shots, "tasks")

	p.jsClick(fmt.Sprintf(`a[href="/ui/tasks/%s"]`, probe.ID))
	p.waitJS(`document.getElementById('phase-chart') !== null`, 10*time.Second)
	if n := evalJS[int](p, `document.querySelectorAll('#phase-chart rect.bar').length`); n < 1 {
		t.Errorf("phase chart has %d bars", n)
	}
	if n := evalJS[int](p, `Math.max(...[...document.querySelectorAll('#phase-chart rect.bar')].map(r => +r.getAttribute('width')))`); n != 300 {
		t.Errorf("longest phase bar is %d px, want 300", n)
	}
	env := evalJS[string](p, `document.getElementById('envelope').textContent`)
	if !strings.Contains(env, "dash-t") || !strings.Contains(env, fmt.Sprint(probe.ExpiresAt.Unix())) {
		t.Errorf("envelope %q", env)
	}
	if !evalJS[bool](p, `document.querySelector('#task-cid a').getAttribute('href') === '/ui/evidence/dash-probe-cid'`) {
		t.Error("correlation id does not link the evidence bundle")
	}
	if !strings.Contains(evalJS[string](p, `document.getElementById('task-history').textContent`), "succeeded") {
		t.Error("state history lacks the final state")
	}
	p.shot(shots, "task")

	// The echo task's params and result show as text, not markup.
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/tasks/"+echo.ID), chromedp.WaitVisible(chromedp.ID("task-params")))
	if evalJS[int](p, `document.querySelectorAll('main b').length`) != 0 {
		t.Error("task params rendered as markup")
	}

	p.jsClick(`header nav a[href="/ui/audit"]`)
	p.waitJS(`location.pathname === '/ui/audit' && document.querySelectorAll('#audit-list tbody tr').length >= 1`, 10*time.Second)
	p.jsSet("#a-action", "task.enqueue")
	p.jsClick("#audit-filter")
	p.waitJS(`location.search.includes('action=task.enqueue')`, 10*time.Second)
	p.shot(shots, "audit")
	evalJS[bool](p, `(() => { window.__exp = null; fetch(document.getElementById('audit-export').href).then(async r =>
		{ window.__exp = r.headers.get('content-type') + '\n' + await r.text(); }); return true; })()`)
	p.waitJS(`window.__exp !== null`, 10*time.Second)
	exp := evalJS[string](p, `window.__exp`)
	ctype, body, _ := strings.Cut(exp, "\n")
	if ctype != "application/x-ndjson" || !strings.Contains(body, `"correlation_id":"dash-probe-cid"`) {
		t.Errorf("export %q:\n%s", ctype, body)
	}
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		var ev api.AuditEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Action != "task.enqueue" {
			t.Errorf("export line %q: %v", line, err)
		}
	}

	// A 390 px phone: the pages do not scroll sideways.
	for _, path := range []string{"/ui/tasks", "/ui/tasks/" + probe.ID, "/ui/audit"} {
		p.do(10*time.Second, chromedp.EmulateViewport(390, 844), chromedp.Navigate(e.opURL+path), chromedp.WaitVisible(chromedp.CSS("main h1")))
		if w := evalJS[int](p, `document.documentElement.scrollWidth`); w > 390 {
			t.Errorf("%s is %d px wide on a 390 px phone: %s", path, w, evalJS[string](p, `[...document.querySelectorAll('body *')].filter(el => el.scrollWidth > 392 || el.getBoundingClientRect().width > 392).slice(0, 6).map(el => el.tagName + '#' + el.id + ' sw=' + el.scrollWidth + ' w=' + el.getBoundingClientRect().width).join(' ')`))
		}
	}
	p.shot(shots, "audit-phone")
}
