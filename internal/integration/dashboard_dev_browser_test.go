package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/drover-dev/drover/internal/wire/api"
)

// devProc is a `drover dev` child process: the control plane, embedded
// SQLite and a local agent (runtime mock) in one process, as the README's
// first command starts it.
type devProc struct {
	t                *testing.T
	opURL            string
	token            string
	hostID           string // the local agent's host id
	cmd              *exec.Cmd
	exited           chan struct{}
	logPath, dataDir string
	heartbeat        time.Duration
	opHTTP           *http.Client
	agentLog         string // the second agent's log
}

// devBannerRE finds the operator address in drover dev's banner.
var devBannerRE = regexp.MustCompile(`operator API +http://(127\.0\.0\.1:[1-9][0-9]*)`)

// startDev starts `drover dev` on free loopback ports and waits until its
// local agent is healthy.
func startDev(t *testing.T, heartbeat time.Duration) *devProc {
	t.Helper()
	bin := buildDrover(t)
	dir := t.TempDir()
	d := &devProc{t: t, dataDir: filepath.Join(dir, "state"), logPath: filepath.Join(dir, "dev.log"),
		heartbeat: heartbeat, hostID: "dev-local", opHTTP: &http.Client{Timeout: 10 * time.Second}}
	logf, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	// Port 0 everywhere: the banner names the operator address it got.
	d.cmd = exec.Command(bin, "dev", "--data-dir", d.dataDir, "--listen", "127.0.0.1:0", "--node-listen", "127.0.0.1:0",
		"--agent-listen", "127.0.0.1:0", "--host-id", d.hostID, "--runtime", "mock",
		"--heartbeat-interval", heartbeat.String())
	d.cmd.Dir = dir
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func() { _ = d.cmd.Wait(); logf.Close(); close(d.exited) }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(os.Interrupt)
		select {
		case <-d.exited:
		case <-time.After(10 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(d.logPath)
			t.Logf("drover dev log:\n%s", b)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if d.opURL == "" {
			log, _ := os.ReadFile(d.logPath)
			if m := devBannerRE.FindSubmatch(log); m != nil {
				d.opURL = "http://" + string(m[1])
			}
		}
		if b, err := os.ReadFile(filepath.Join(d.dataDir, "operator.token")); d.opURL != "" && err == nil && len(bytes.TrimSpace(b)) > 0 {
			d.token = strings.TrimSpace(string(b))
			if resp, err := http.Get(d.opURL + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
		}
		select {
		case <-d.exited:
			b, _ := os.ReadFile(d.logPath)
			t.Fatalf("drover dev exited:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("drover dev did not become ready in 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.waitStatus(d.hostID, api.HostHealthy, 30*time.Second)
	return d
}

// op calls the operator API with the dev operator token (env.op does the
// work; only its URL, token and client are set).
func (d *devProc) op(method, path string, in, out any) int {
	d.t.Helper()
	return (&env{t: d.t, opURL: d.opURL, opToken: d.token, opHTTP: d.opHTTP}).op(method, path, in, out)
}

// waitAllocationActive waits until the allocation is active (its user
// provisioned on the node).
func (d *devProc) waitAllocationActive(id string) {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var a api.Allocation
		d.op(http.MethodGet, "/api/v1/allocations/"+id, nil, &a)
		if a.State == api.AllocationActive {
			return
		}
		if a.State == api.AllocationFailed || time.Now().After(deadline) {
			d.t.Fatalf("allocation %s: %s %s", id, a.State, a.StateReason)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitAllocationGone waits (up to 30 s) until a released allocation's
// user is removed, so the test leaves no OS user behind.
func (d *devProc) waitAllocationGone(id string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var a api.Allocation
		if st := d.op(http.MethodGet, "/api/v1/allocations/"+id, nil, &a); st == http.StatusNotFound || a.State == api.AllocationReleased {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.t.Errorf("allocation %s not released in 30s", id)
}

func (d *devProc) waitStatus(id string, want api.HostStatus, within time.Duration) api.Host {
	d.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var h api.Host
		if d.op(http.MethodGet, "/api/v1/hosts/"+id, nil, &h) == http.StatusOK && h.Status == want {
			return h
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("host %s: status %q after %s, want %q", id, h.Status, within, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startSecondAgent creates a host record and starts a real drover-agent
// process for it with the env the API hands out.
func (d *devProc) startSecondAgent(id string) *agentProc {
	d.t.Helper()
	var bt api.BootstrapToken
	if st := d.op(http.MethodPost, "/api/v1/hosts", api.CreateHostRequest{HostID: id, OSFamily: "linux"}, &bt); st != http.StatusCreated {
		d.t.Fatalf("create host %s: HTTP %d", id, st)
	}
	dir := d.t.TempDir()
	d.agentLog = filepath.Join(dir, "agent.log")
	d.t.Cleanup(func() {
		if d.t.Failed() {
			b, _ := os.ReadFile(d.agentLog)
			d.t.Logf("%s agent log:\n%s", id, b)
		}
	})
	return startAgentProc(d.t, buildAgent(d.t), []string{
		"NODE_AGENT_CONTROL_PLANE_URL=" + bt.NodeURL, "NODE_AGENT_HOST_ID=" + id,
		"NODE_AGENT_BOOTSTRAP_TOKEN=" + bt.Token, "NODE_AGENT_CA_HASH=" + bt.CAHash,
		"NODE_AGENT_OS_FAMILY=linux", "NODE_AGENT_STATE_DIR=" + filepath.Join(dir, "state"),
		"NODE_AGENT_LISTEN=127.0.0.1:0", "NODE_AGENT_RUNTIME=none", "NODE_AGENT_QEMU_ACCEL=tcg",
	}, d.agentLog)
}

// TestDashboardDevBrowser is the dashboard's acceptance run against the
// real binaries: `drover dev` (control plane, SQLite, its local agent) and
// a second drover-agent process, driven in headless Chromium. Both hosts
// show healthy with os_family and accelerator as the API reports them; a
// health probe run from the host page shows its phases on its task page
// and its evidence bundle downloads; a token rotation shows the new
// token's env once; a terminal opened from the dashboard runs a command;
// the second agent killed turns stale on the open fleet page without a
// reload; a POST without the CSRF token and a viewer's forged POST get 403.
func TestDashboardDevBrowser(t *testing.T) {
	shots := t.TempDir() // DROVER_SCREENSHOT_DIR keeps them
	if d := os.Getenv("DROVER_SCREENSHOT_DIR"); d != "" {
		shots = d
	}
	d := startDev(t, time.Second)
	second := d.startSecondAgent("dev-second")
	d.waitStatus("dev-second", api.HostHealthy, 30*time.Second)
	var viewer api.OperatorToken
	if st := d.op(http.MethodPost, "/api/v1/tokens", api.CreateOperatorTokenRequest{Name: "dev-viewer", Role: api.RoleViewer}, &viewer); st != http.StatusCreated {
		t.Fatalf("create viewer token: HTTP %d", st)
	}

	p := startBrowser(t)
	e := &env{t: t, opURL: d.opURL} // dashLogin needs only the URL
	p.dashLogin(e, d.token)
	cell := func(id, class string) string {
		return `(document.querySelector('#host-` + id + ` .` + class + `') || {textContent: ''}).textContent`
	}
	p.waitJS(cell(d.hostID, "status")+`.startsWith('healthy') && `+cell("dev-second", "status")+`.startsWith('healthy')`, 10*time.Second)
	for _, id := range []string{d.hostID, "dev-second"} {
		var h api.Host
		d.op(http.MethodGet, "/api/v1/hosts/"+id, nil, &h)
		if got := evalJS[string](p, cell(id, "os")); got != "linux" || h.OSFamily != "linux" {
			t.Errorf("%s: os cell %q, API os_family %q", id, got, h.OSFamily)
		}
		accel := strings.TrimSpace(evalJS[string](p, cell(id, "accel")))
		if h.SelectedAccel == "" || !strings.HasPrefix(accel, h.SelectedAccel+" ") {
			t.Errorf("%s: accelerator cell %q, API selected_accel %q", id, accel, h.SelectedAccel)
		}
	}
	p.shot(shots, "dev-fleet")

	// A health probe from the second host's page; its task page shows the
	// probe's phases as a chart.
	p.do(10*time.Second, chromedp.Navigate(d.opURL+"/ui/hosts/dev-second"), chromedp.WaitVisible(chromedp.ID("act-health-probe")))
	if st := p.postStatus("/ui/hosts/dev-second/actions/drain", nil); st != 403 {
		t.Errorf("POST without CSRF token: %d, want 403", st)
	}
	p.jsClick("#act-health-probe")
	p.waitJS(`(document.getElementById('action-done') || {textContent: ''}).textContent.startsWith('health probe queued: task ')`, 10*time.Second)
	taskID := strings.TrimPrefix(evalJS[string](p, `document.getElementById('action-done').textContent`), "health probe queued: task ")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var tk api.Task
		d.op(http.MethodGet, "/api/v1/tasks/"+taskID, nil, &tk)
		if tk.State == api.TaskSucceeded {
			break
		}
		if tk.State.Terminal() || time.Now().After(deadline) {
			t.Fatalf("health probe task %s: %+v", taskID, tk)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.do(10*time.Second, chromedp.Navigate(d.opURL+"/ui/tasks/"+taskID))
	p.waitJS(`document.querySelectorAll('#phase-chart rect').length > 0`, 10*time.Second)
	p.shot(shots, "dev-task")

	// The probe's evidence bundle, downloaded through the dashboard.
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	var probe api.Task
	d.op(http.MethodGet, "/api/v1/tasks/"+taskID, nil, &probe)
	bundle, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch('/ui/evidence/`+probe.CorrelationID+`')
		.then(r => r.ok ? r.arrayBuffer() : Promise.reject('HTTP ' + r.status))
		.then(b => { let s = ''; new Uint8Array(b).forEach(c => s += String.fromCharCode(c)); return btoa(s); })`, chromedp.EvalAwaitPromise))
	cancel()
	if err != nil {
		t.Fatalf("download the evidence bundle: %v", err)
	}
	checkEvidenceBundle(t, bundle, probe.CorrelationID)

	// Rotate the second host's bootstrap token: shown once, with the env.
	p.do(10*time.Second, chromedp.Navigate(d.opURL+"/ui/hosts/dev-second"), chromedp.WaitVisible(chromedp.ID("act-rotate-token")))
	p.jsClick("#act-rotate-token")
	p.waitJS(`!!document.getElementById('agent-env')`, 10*time.Second)
	if env := evalJS[string](p, `document.getElementById('agent-env').textContent`); !strings.Contains(env, "NODE_AGENT_BOOTSTRAP_TOKEN=") ||
		!strings.Contains(env, "NODE_AGENT_HOST_ID=dev-second") {
		t.Errorf("the rotated token's env: %q", env)
	}

	// A terminal on drover dev's own host: an allocation its agent
	// provisions, opened from the dashboard, a command typed and answered.
	if os.Geteuid() == 0 {
		user := fmt.Sprintf("drvdev%05d", rand.IntN(100000))
		var alloc api.Allocation
		if st := d.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: d.hostID}, &alloc); st != http.StatusCreated {
			t.Fatalf("create allocation: HTTP %d", st)
		}
		t.Cleanup(func() {
			d.op(http.MethodDelete, "/api/v1/allocations/"+alloc.ID, nil, nil)
			d.waitAllocationGone(alloc.ID)
		})
		d.waitAllocationActive(alloc.ID)
		p.do(10*time.Second, chromedp.Navigate(d.opURL+"/ui/allocations"))
		p.waitJS(`document.querySelector('#alloc-`+alloc.ID+` a.open-terminal')`, 10*time.Second)
		p.jsClick(`#alloc-` + alloc.ID + ` a.open-terminal`)
		p.waitJS(`document.getElementById('term-state').textContent === 'pty_ready'`, 30*time.Second)
		p.do(5*time.Second, chromedp.Click(chromedp.CSS("#term-container .xterm")))
		p.typeKeys("echo dev-$((6*7))" + kb.Enter)
		p.waitLine(termJS, regexp.MustCompile(`^dev-42$`), 15*time.Second)
		p.shot(shots, "dev-terminal")
		p.typeKeys("exit" + kb.Enter)
		p.waitJS(`document.getElementById('term-state').textContent === 'exited'`, 15*time.Second)
	} else {
		t.Log("not root: the terminal step is left out (the allocation user is created with useradd)")
	}

	// The second agent dies: its row turns stale on the open fleet page.
	p.do(10*time.Second, chromedp.Navigate(d.opURL+"/ui/fleet"))
	p.waitJS(`document.getElementById('fleet').dataset.live === '1'`, 10*time.Second)
	evalJS[bool](p, `window.__sameDocument = true`)
	second.kill9()
	p.waitJS(cell("dev-second", "status")+`.startsWith('stale')`, 3*d.heartbeat+3*d.heartbeat+2*time.Second)
	if !evalJS[bool](p, `window.__sameDocument === true`) {
		t.Error("the fleet page reloaded")
	}
	if !strings.HasPrefix(evalJS[string](p, cell(d.hostID, "status")), "healthy") {
		t.Errorf("the dev host is %q after the second agent died", evalJS[string](p, cell(d.hostID, "status")))
	}
	p.shot(shots, "dev-fleet-stale")

	// A viewer: no action controls, and a forged POST with its own valid
	// CSRF token is refused.
	p.jsClick(`header form button`)
	p.waitJS(`location.pathname === '/ui/login'`, 10*time.Second)
	p.dashLogin(e, viewer.Token)
	p.do(10*time.Second, chromedp.Navigate(d.opURL+"/ui/hosts/"+d.hostID), chromedp.WaitVisible(chromedp.ID("host-status")))
	if n := evalJS[int](p, `document.querySelectorAll('main form, main button').length`); n != 0 {
		t.Errorf("viewer's host page has %d action controls", n)
	}
	csrf := evalJS[string](p, `document.querySelector('header input[name=csrf]').value`)
	if st := p.postStatus("/ui/hosts/"+d.hostID+"/actions/drain", map[string]string{"csrf": csrf}); st != 403 {
		t.Errorf("viewer's forged drain: %d, want 403", st)
	}
	var h api.Host
	d.op(http.MethodGet, "/api/v1/hosts/"+d.hostID, nil, &h)
	if h.Draining {
		t.Error("the dev host is draining after the refused POSTs")
	}
}
