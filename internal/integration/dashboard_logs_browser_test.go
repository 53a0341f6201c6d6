package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

// logLinesJS is the instance page's live log view as text.
const logLinesJS = `document.querySelector('#instance-logs pre.logs').textContent`

// TestDashboardLogsBrowser opens an instance page in a real headless
// Chromium against the real control plane and a real agent on the mock
// runtime: the Logs section shows the instance's log, a line the workload
// writes afterwards appears live (stderr styled apart), and leaving the
// page closes the log reader on the node.
func TestDashboardLogsBrowser(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("dash-logs")
	rt := mock.New(mock.Options{})
	e.startAgent("dash-logs", bt.Token, agentOpts{rt: rt})
	e.waitHostStatus("dash-logs", api.HostHealthy, 15*time.Second)
	waitCapacity(t, e, "dash-logs")
	in := e.createInstance(api.CreateInstanceRequest{Name: "chatty", HostID: "dash-logs",
		Spec: api.InstanceSpec{Image: fakeImage, VCPUs: 1, MemoryMiB: 128}})
	e.waitPhase(in.ID, api.InstanceReady, "", 15*time.Second)

	p := startBrowser(t)
	p.dashLogin(e, e.opToken)
	p.jsClick(`header nav a[href="/ui/instances"]`)
	p.waitJS(`document.querySelector('#instance-list a[href="/ui/instances/`+in.ID+`"]') !== null`, 10*time.Second)
	p.jsClick(fmt.Sprintf(`#instance-list a[href="/ui/instances/%s"]`, in.ID))
	p.waitJS(`document.getElementById('instance-logs') !== null`, 10*time.Second)
	p.waitJS(logLinesJS+`.includes('mock: instance `+in.ID+` started')`, 15*time.Second)
	if got := evalJS[string](p, `document.querySelector('#instance-logs .logs-status').textContent`); got != "live" {
		t.Errorf("log status = %q, want live", got)
	}

	rt.AppendLog(in.ID, "stderr", "disk 93% full")
	p.waitJS(logLinesJS+`.includes('disk 93% full')`, 10*time.Second)
	if !evalJS[bool](p, `[...document.querySelectorAll('#instance-logs .log-stderr')].some(s => s.textContent.includes('disk 93% full'))`) {
		t.Error("the stderr line is not marked as stderr")
	}
	if n := rt.OpenLogReaders(); n != 1 {
		t.Errorf("%d log readers open on the node while the page follows, want 1", n)
	}
	p.noExceptions()

	// Leaving the page ends the stream on the node.
	p.jsClick(`header nav a[href="/ui/instances"]`)
	p.waitJS(`location.pathname === '/ui/instances'`, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for rt.OpenLogReaders() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the node's log reader is still open 10s after the page was left")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !e.auditHas("instance.logs", in.ID, "ok") {
		t.Error("no audit record of the dashboard's log stream")
	}
}
