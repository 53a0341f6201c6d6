package integration

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestDashboardTour visits every dashboard page on a fleet with hosts in
// different states (healthy, draining, disabled, stale, auth_failed after
// a revoke, unknown before enrolment), an instance, an allocation with a
// terminal session, a health probe and a preflight run. On each page it
// runs the accessibility audit (a11y_test.go) at 1280 px, checks a 390 px
// phone does not scroll sideways, and saves a screenshot.
//
// The screenshots go to a temporary directory, or to DROVER_TOUR_DIR: the
// README's images are made with
//
//	DROVER_TOUR_DIR=$PWD/docs/images go test ./internal/integration -run TestDashboardTour
func TestDashboardTour(t *testing.T) {
	if os.Geteuid() != 0 && os.Getenv("CI") != "true" {
		t.Skip("the allocation user is created with useradd, which needs root")
	}
	shots := t.TempDir()
	if d := os.Getenv("DROVER_TOUR_DIR"); d != "" {
		shots = d
	}
	p := startBrowser(t)
	e := startEnv(t, openSQLite(t), func(c *server.Config) {
		c.Terminal = server.TerminalConfig{RecordingDir: t.TempDir()}
	})

	// The fleet: gpu-01 runs instances (mock runtime) and allocations;
	// gpu-02's KVM does not work and it drains; ci-runner-03 is disabled;
	// ci-runner-04 stopped heartbeating; edge-05 was revoked; edge-06 has
	// a record but never enrolled.
	bt := e.createHost("gpu-01")
	e.startAgent("gpu-01", bt.Token, agentOpts{accel: "tcg", runtime: "mock"})
	bt = e.createHost("gpu-02")
	e.startAgent("gpu-02", bt.Token, agentOpts{accel: "kvm"})
	bt = e.createHost("ci-runner-03")
	e.startAgent("ci-runner-03", bt.Token, agentOpts{accel: "tcg"})
	bt = e.createHost("ci-runner-04")
	_, stop04 := e.startAgent("ci-runner-04", bt.Token, agentOpts{accel: "tcg"})
	bt = e.createHost("edge-05")
	e.startAgent("edge-05", bt.Token, agentOpts{accel: "tcg"})
	e.createHost("edge-06")
	for _, id := range []string{"gpu-01", "gpu-02", "ci-runner-03", "ci-runner-04", "edge-05"} {
		e.waitHostStatus(id, api.HostHealthy, 30*time.Second)
	}
	for path, want := range map[string]int{"/api/v1/hosts/gpu-02/drain": http.StatusOK,
		"/api/v1/hosts/ci-runner-03/disable": http.StatusOK, "/api/v1/hosts/edge-05/revoke": http.StatusOK} {
		if st := e.op(http.MethodPost, path, struct{}{}, nil); st != want {
			t.Fatalf("POST %s: HTTP %d", path, st)
		}
	}
	stop04()
	e.waitHostStatus("edge-05", api.HostAuthFailed, 10*time.Second)
	e.waitHostStatus("ci-runner-04", api.HostStale, 10*harnessHeartbeat)

	// Work on gpu-01: a health probe, a preflight, an instance.
	probe := e.enqueue("gpu-01", "diag.health_probe", struct{}{})
	pre := e.enqueue("gpu-01", "diag.preflight", struct{}{})
	for _, id := range []string{probe.ID, pre.ID} {
		if tk := e.waitTask(id, 30*time.Second); tk.State != api.TaskSucceeded {
			t.Fatalf("task %s: %+v", id, tk)
		}
	}
	waitCapacity(t, e, "gpu-01")
	in := e.createInstance(api.CreateInstanceRequest{Name: "web-1", HostID: "gpu-01", Spec: api.InstanceSpec{Image: fakeImage,
		VCPUs: 2, MemoryMiB: 512, Network: api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 80}}},
		HealthCheck: &api.HealthCheck{Interval: api.Duration(5 * time.Second), FailureThreshold: 3}}})
	e.waitPhase(in.ID, api.InstanceReady, "", 15*time.Second)

	user := fmt.Sprintf("drvt%06d", rand.IntN(1000000))
	var alloc api.Allocation
	if st := e.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: "gpu-01"}, &alloc); st != http.StatusCreated {
		t.Fatalf("create allocation: HTTP %d", st)
	}
	t.Cleanup(func() { // before the agent stops, so the user is removed
		if st := e.op(http.MethodDelete, "/api/v1/allocations/"+alloc.ID, nil, nil); st == http.StatusAccepted {
			e.waitAllocation(alloc.ID, 30*time.Second, api.AllocationReleased)
		}
	})
	if a := e.waitAllocation(alloc.ID, 30*time.Second, api.AllocationActive, api.AllocationFailed); a.State != api.AllocationActive {
		t.Fatalf("allocation %s: %s", a.State, a.StateReason)
	}

	// visit audits and photographs the open page at 1280 px and at 390 px.
	visit := func(name string) {
		t.Helper()
		p.do(10*time.Second, chromedp.EmulateViewport(1280, 800))
		p.auditA11y(name)
		p.shot(shots, name)
		p.do(10*time.Second, chromedp.EmulateViewport(390, 844))
		p.auditPhone(name)
		p.do(10*time.Second, chromedp.EmulateViewport(1280, 800))
	}
	open := func(path, ready string) {
		t.Helper()
		p.do(10*time.Second, chromedp.Navigate(e.opURL+path))
		p.waitJS(ready, 10*time.Second)
	}

	p.do(10*time.Second, chromedp.EmulateViewport(1280, 800), chromedp.Navigate(e.opURL+"/ui/login"), chromedp.WaitVisible(chromedp.ID("token")))
	visit("login")
	p.dashLogin(e, e.opToken)
	p.waitJS(`['gpu-01', 'gpu-02', 'ci-runner-03', 'ci-runner-04', 'edge-05', 'edge-06'].every(id => document.getElementById('host-' + id))`, 10*time.Second)
	for id, want := range map[string]string{"gpu-01": "healthy", "ci-runner-04": "stale", "edge-05": "auth_failed", "edge-06": "unknown"} {
		p.waitJS(fmt.Sprintf(`document.querySelector('#host-%s .status').textContent.startsWith(%q)`, id, want), 10*time.Second)
	}
	visit("fleet")
	open("/ui/hosts/gpu-01", `document.getElementById('preflight-latest') && document.getElementById('inv-cpu')`)
	visit("host")
	open("/ui/tasks", `document.querySelectorAll('#task-list tbody tr[data-type]').length >= 2`)
	visit("tasks")
	open("/ui/tasks/"+probe.ID, `document.querySelectorAll('#phase-chart rect').length > 0`)
	visit("task")
	open("/ui/audit", `document.querySelectorAll('main table tbody tr').length > 0`)
	visit("audit")
	open("/ui/instances", `document.getElementById('instance-`+in.ID+`')`)
	visit("instances")
	open("/ui/instances/"+in.ID, `document.querySelectorAll('#transitions tbody tr').length >= 2`)
	visit("instance")
	open("/ui/allocations", `document.getElementById('alloc-`+alloc.ID+`')`)
	visit("allocations")

	// A terminal session, so the allocation page has a chain and a replay.
	open("/ui/allocations/"+alloc.ID+"/terminal", `window.droverTerm !== undefined`)
	p.waitJS(`document.getElementById('term-state').textContent === 'pty_ready'`, 30*time.Second)
	sid := evalJS[string](p, `droverTerm.sessionId()`)
	p.do(5*time.Second, chromedp.Click(chromedp.CSS("#term-container .xterm")))
	p.typeKeys("echo tour-$((6*7))" + kb.Enter)
	p.waitLine(termJS, regexp.MustCompile(`^tour-42$`), 15*time.Second)
	p.shot(shots, "terminal") // the terminal page is audited by TestDashboardTerminal
	p.typeKeys("exit" + kb.Enter)
	p.waitJS(`document.getElementById('term-state').textContent === 'exited'`, 15*time.Second)
	e.waitSessionClosed(sid, 10*time.Second)
	open("/ui/allocations/"+alloc.ID, `document.getElementById('session-`+sid+`')`)
	visit("allocation")
	p.noExceptions()
}
