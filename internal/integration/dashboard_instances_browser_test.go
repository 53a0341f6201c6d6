package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
)

// transitionsJS is the instance page's transitions table as "phase/reason
// by actor" lines.
const transitionsJS = `[...document.querySelectorAll('#transitions tbody tr[data-phase]')].map(r =>
	r.dataset.phase + '/' + r.cells[3].textContent.replace('—', '') + ' by ' + r.cells[6].textContent).join('\n')`

// TestDashboardInstancesBrowser drives /ui/instances and /ui/instances/{id}
// in a real headless Chromium against the real control plane and a real
// agent running the mock runtime: the list and its filters, the detail
// page's desired vs actual, transitions and phase timeline, a viewer
// without controls, stop from the UI (the agent's Stopped shows with its
// reason code), and a delete that needs the name typed back.
func TestDashboardInstancesBrowser(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	shots := t.TempDir() // DROVER_SCREENSHOT_DIR keeps them
	if d := os.Getenv("DROVER_SCREENSHOT_DIR"); d != "" {
		shots = d
	}
	bt := e.createHost("dash-i")
	e.startAgent("dash-i", bt.Token, agentOpts{runtime: "mock"})
	e.waitHostStatus("dash-i", api.HostHealthy, 15*time.Second)
	waitCapacity(t, e, "dash-i")
	in := e.createInstance(api.CreateInstanceRequest{Name: "web-ui", HostID: "dash-i", Spec: api.InstanceSpec{Image: fakeImage,
		VCPUs: 1, MemoryMiB: 128, Network: api.NetworkSpec{Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22}}},
		HealthCheck: &api.HealthCheck{Interval: api.Duration(time.Second), FailureThreshold: 2}}})
	e.createInstance(api.CreateInstanceRequest{Name: "other", HostID: "dash-i", Spec: api.InstanceSpec{Image: fakeImage, VCPUs: 1, MemoryMiB: 128}})
	e.waitPhase(in.ID, api.InstanceReady, "", 15*time.Second)

	p := startBrowser(t)
	p.dashLogin(e, e.opToken)
	p.jsClick(`header nav a[href="/ui/instances"]`)
	p.waitJS(`location.pathname === '/ui/instances' && document.querySelectorAll('#instance-list tbody tr[data-phase]').length === 2`, 10*time.Second)
	// Search with the form: only web-ui is left, converged and Ready.
	p.jsSet("#f-q", "web")
	p.jsSet("#f-phase", "Ready")
	p.jsClick("#instance-filter")
	p.waitJS(`location.search.includes('q=web') && document.querySelectorAll('#instance-list tbody tr[data-phase]').length === 1`, 10*time.Second)
	p.do(10*time.Second, chromedp.WaitVisible(chromedp.ID("instance-list")))
	row := evalJS[string](p, fmt.Sprintf(`document.getElementById('instance-%s').textContent`, in.ID))
	for _, want := range []string{"web-ui", "dash-i", "running", "Ready", "converged", "mock", "every 1s, failed after 2 in a row"} {
		if !strings.Contains(row, want) {
			t.Errorf("instance row %q lacks %q", row, want)
		}
	}
	if !evalJS[bool](p, `['f-host', 'f-phase', 'f-desired', 'f-q'].every(id => document.querySelector('label[for=' + id + ']') !== null)`) {
		t.Error("filters are not labelled")
	}
	p.shot(shots, "instances")

	p.jsClick(fmt.Sprintf(`#instance-list a[href="/ui/instances/%s"]`, in.ID))
	p.waitJS(`document.getElementById('phase-timeline') !== null`, 10*time.Second)
	got := evalJS[string](p, transitionsJS)
	if want := "Pending/ by operator:test\nBooting/ by node:dash-i\nReady/ by node:dash-i"; got != want {
		t.Errorf("transitions:\n%s\nwant:\n%s", got, want)
	}
	if lanes := evalJS[string](p, `[...document.querySelectorAll('#phase-timeline g.span')].map(g => g.dataset.phase).join(',')`); lanes != "Pending,Booting,Ready" {
		t.Errorf("timeline spans %q", lanes)
	}
	for id, want := range map[string]string{"desired-state": "running", "actual-phase": "Ready", "converged": "converged",
		"health-state": "passing"} {
		if got := evalJS[string](p, `document.getElementById('`+id+`').textContent`); !strings.Contains(got, want) {
			t.Errorf("#%s = %q, want %q", id, got, want)
		}
	}
	if href := evalJS[string](p, `document.getElementById('serial-console').getAttribute('href')`); href != "/ui/allocations?instance_id="+in.ID {
		t.Errorf("serial console link %q", href)
	}
	if href := evalJS[string](p, `document.getElementById('instance-audit').getAttribute('href')`); href != "/ui/audit?target="+in.ID {
		t.Errorf("audit link %q", href)
	}
	p.shot(shots, "instance")

	// A viewer sees the page without any control.
	viewer, err := e.srv.CreateOperatorToken(context.Background(), server.OperatorTokenSpec{Name: "inst-viewer", Role: api.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	p.dashLogin(e, viewer.Token)
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/instances/"+in.ID), chromedp.WaitVisible(chromedp.ID("transitions")))
	if n := evalJS[int](p, `document.querySelectorAll('#act-start, #act-stop, #act-delete, form[action*="/actions/"]').length`); n != 0 {
		t.Errorf("a viewer sees %d action controls", n)
	}

	// Stop from the UI: the desired change by the operator, then the
	// agent's graceful Draining and Stopped, both with their reason.
	p.dashLogin(e, e.opToken)
	p.do(10*time.Second, chromedp.Navigate(e.opURL+"/ui/instances/"+in.ID), chromedp.WaitVisible(chromedp.ID("act-stop")),
		chromedp.Click(chromedp.ID("act-stop")))
	p.waitJS(`document.getElementById('action-done') !== null`, 10*time.Second)
	e.waitPhase(in.ID, api.InstanceStopped, api.ReasonTerminatedByOperator, 15*time.Second)
	p.do(10*time.Second, chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("transitions")))
	got = evalJS[string](p, transitionsJS)
	if want := "Ready/ by operator:test\nDraining/terminated_by_operator by node:dash-i\nStopped/terminated_by_operator by node:dash-i"; !strings.HasSuffix(got, want) {
		t.Errorf("transitions after stop:\n%s\nwant them to end with:\n%s", got, want)
	}
	if lanes := evalJS[string](p, `[...document.querySelectorAll('#phase-timeline g.span')].map(g => g.dataset.phase).join(',')`); lanes != "Pending,Booting,Ready,Draining,Stopped" {
		t.Errorf("timeline spans after stop %q", lanes)
	}
	if got := evalJS[string](p, `document.getElementById('desired-state').textContent`); got != "stopped" {
		t.Errorf("desired after stop %q", got)
	}
	p.shot(shots, "instance-stopped")

	// Delete: the wrong name deletes nothing; the right one asks the agent.
	p.jsSet("#confirm", "web")
	p.jsClick("#act-delete")
	p.waitJS(`document.getElementById('confirm-error') !== null`, 10*time.Second)
	var still api.Instance
	if st := e.op(http.MethodGet, "/api/v1/instances/"+in.ID, nil, &still); st != http.StatusOK || still.DesiredState != api.DesiredStopped {
		t.Fatalf("after a refused delete: HTTP %d desired %s", st, still.DesiredState)
	}
	p.jsSet("#confirm", "web-ui")
	p.jsClick("#act-delete")
	p.waitJS(`document.getElementById('action-done') !== null || document.querySelector('.error') !== null`, 10*time.Second)
	e.waitGone(in.ID, 15*time.Second)

	// A 390 px phone: the list does not scroll sideways.
	p.do(10*time.Second, chromedp.EmulateViewport(390, 844), chromedp.Navigate(e.opURL+"/ui/instances"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	if w := evalJS[int](p, `document.documentElement.scrollWidth`); w > 390 {
		t.Errorf("/ui/instances is %d px wide on a 390 px phone", w)
	}
}
