package integration

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestDashboardHostBrowser drives the dashboard's host page in a real
// headless Chromium against the real control plane and a real agent: the
// device tables and the capacity plot, Run preflight (a diag.preflight
// task whose report becomes the host's preflight run: its hops appear and
// the last successful preflight is set, without a reload), and the status
// turning stale without a reload when the agent stops.
func TestDashboardHostBrowser(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	shots := t.TempDir() // DROVER_SCREENSHOT_DIR keeps them
	if d := os.Getenv("DROVER_SCREENSHOT_DIR"); d != "" {
		shots = d
	}
	const id = "host-detail-a"
	bt := e.createHost(id)
	_, stop := e.startAgent(id, bt.Token, agentOpts{accel: "tcg"})
	e.waitHostStatus(id, api.HostHealthy, 15*time.Second)

	p := startBrowser(t)
	p.dashLogin(e, e.opToken)
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/hosts/"+id), chromedp.WaitVisible(chromedp.ID("inv-cpu")))

	// Device tables: captioned, from the agent's real inventory.
	for _, tbl := range []string{"inv-cpu", "inv-gpus", "inv-nics", "inv-disks", "inv-iommu"} {
		if !evalJS[bool](p, `!!document.querySelector('#`+tbl+` caption') && document.querySelector('#`+tbl+`').closest('.scroll') !== null`) {
			t.Errorf("#%s has no caption or is not in a horizontal scroller", tbl)
		}
	}
	if got := evalJS[string](p, `document.querySelector('#inv-cpu tbody tr:nth-child(2) td').textContent`); !strings.Contains(got, " / ") {
		t.Errorf("sockets / cores / threads cell %q", got)
	}
	if !evalJS[bool](p, `!!document.querySelector('details pre') && document.querySelector('details pre').textContent.includes('"cpu"')`) {
		t.Error("the raw inventory JSON is not on the page")
	}
	// Capacity plot: four labelled stacked bars.
	labels := evalJS[[]string](p, `[...document.querySelectorAll('#capacity-chart g.resource text.label')].map(t => t.textContent)`)
	if len(labels) != 4 || !strings.HasPrefix(labels[0], "vCPU: ") || !strings.Contains(labels[0], " free") {
		t.Errorf("capacity plot labels %q", labels)
	}
	if n := evalJS[int](p, `document.querySelectorAll('#capacity-chart rect.cap-free').length`); n != 4 {
		t.Errorf("capacity plot: %d free segments, want 4", n)
	}
	if got := evalJS[string](p, `document.getElementById('last-preflight-ok').textContent`); got != "never" {
		t.Errorf("last successful preflight before any run: %q", got)
	}

	// Run preflight: queued as a task, its report arrives on the page by
	// itself (the live block polls).
	p.jsClick("#act-preflight")
	p.waitJS(`(document.getElementById('action-done') || {}).textContent?.startsWith('preflight queued: task ')`, 10*time.Second)
	done := evalJS[string](p, `document.getElementById('action-done').textContent`)
	taskID := strings.TrimPrefix(done, "preflight queued: task ")
	evalJS[bool](p, `window.__sameDocument = true`)
	runID := "pfr_" + strings.TrimPrefix(taskID, "tsk_")
	p.waitJS(`(document.getElementById('preflight-latest') || {dataset: {}}).dataset.run === '`+runID+`'`, 30*time.Second)
	if latest := evalJS[string](p, `document.getElementById('preflight-latest').textContent`); !strings.Contains(latest, "passed") {
		t.Errorf("preflight run: %s\nhops: %s", latest, evalJS[string](p, `document.getElementById('preflight-hops').textContent`))
	}
	p.waitJS(`document.getElementById('last-preflight-ok').textContent !== 'never'`, 5*time.Second)
	if n := evalJS[int](p, `document.querySelectorAll('#preflight-hops tbody tr[data-status="passed"]').length`); n != 3 {
		t.Errorf("%d passed hops shown, want 3", n)
	}
	if task := e.waitTask(taskID, 5*time.Second); task.Type != "diag.preflight" || task.State != api.TaskSucceeded {
		t.Errorf("preflight task %+v", task)
	}
	p.auditA11y("host page")
	p.shot(shots, "host-detail")

	// The agent stops: the page's status turns stale without a reload
	// (stale after 3 intervals, polled every interval).
	stop()
	p.waitJS(`document.getElementById('host-status').textContent === 'stale'`, 3*harnessHeartbeat+3*harnessHeartbeat+time.Second)
	if !evalJS[bool](p, `window.__sameDocument === true`) {
		t.Error("the host page reloaded")
	}
	p.shot(shots, "host-detail-stale")

	// A 390 px phone: the page does not scroll sideways (the device tables
	// scroll in their own boxes).
	p.do(10*time.Second, chromedp.EmulateViewport(390, 844), chromedp.Navigate(e.opURL+"/ui/hosts/"+id), chromedp.WaitVisible(chromedp.ID("inv-cpu")))
	p.auditPhone("host page")
	p.shot(shots, "host-detail-phone")
}
