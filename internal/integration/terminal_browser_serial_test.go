package integration

import (
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestTerminalBrowserSerial opens the serial console of a real TCG guest in
// the browser. The guest runs no shell on ttyS0 (qemutest's /init only
// prints markers), so the output checked is what it prints when the
// operator stops it: the power-off marker, live, then the console's end.
func TestTerminalBrowserSerial(t *testing.T) {
	p := startBrowser(t)
	spec, _, imgDirs := tcgGuest(t)
	e := browserEnv(t)
	bt := e.createHost("vm-term")
	rtDir := t.TempDir()
	e.startAgent("vm-term", bt.Token, agentOpts{runtime: "qemu", imageDirs: imgDirs, runtimeDir: rtDir})
	t.Cleanup(func() { // a failed test leaves no guest running
		for _, pid := range qemuProcesses(t, rtDir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	e.waitHostStatus("vm-term", api.HostHealthy, 30*time.Second)
	waitCapacity(t, e, "vm-term")
	in := e.createInstance(api.CreateInstanceRequest{Name: "console", HostID: "vm-term", Spec: spec})
	e.waitPhase(in.ID, api.InstanceReady, "", 2*time.Minute)

	var alloc api.Allocation
	if st := e.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: "console", InstanceID: in.ID}, &alloc); st != http.StatusCreated {
		t.Fatalf("create instance allocation: HTTP %d", st)
	}
	if alloc.State != api.AllocationActive || alloc.Kind != api.AllocationInstance {
		t.Fatalf("instance allocation %+v", alloc)
	}

	p.login(e)
	p.openTerminal(alloc.ID)
	p.waitJS(`document.getElementById('term-state').textContent === 'pty_ready'`, 30*time.Second)
	sid := evalJS[string](p, `droverTerm.sessionId()`)
	p.do(5*time.Second, chromedp.Click(chromedp.CSS("#term-container .xterm")))
	p.typeKeys(kb.Enter) // input reaches the serial line without breaking the session
	time.Sleep(300 * time.Millisecond)
	if st := p.text("term-state"); st != "pty_ready" {
		p.fatalf("after Enter the terminal is %q", st)
	}

	if st := e.op(http.MethodPost, "/api/v1/instances/"+in.ID+"/stop", nil, nil); st != http.StatusOK {
		t.Fatalf("stop: HTTP %d", st)
	}
	p.waitLine(termJS, regexp.MustCompile(`^`+qemutest.PoweroffMarker+`\s*$`), 60*time.Second)
	// QEMU exits, the console socket ends, and so does the session, as an
	// exit (code 0: a serial line has no exit status).
	p.waitJS(`['exited', 'closed', 'failed'].includes(document.getElementById('term-state').textContent)`, 30*time.Second)
	if st, code := p.text("term-state"), p.text("term-exit-code"); st != "exited" || code != "0" {
		p.fatalf("after the guest powered off the terminal is %q (exit code %q), want exited with 0", st, code)
	}
	s := e.waitSessionClosed(sid, 10*time.Second)
	if s.Mode != "serial" || s.InstanceID != in.ID || s.CloseReason != "exit" {
		t.Fatalf("session %+v", s)
	}
	if out := e.recordedOutput(s); !strings.Contains(out, qemutest.PoweroffMarker) {
		t.Fatalf("the recording lacks %s:\n%q", qemutest.PoweroffMarker, out)
	}
	e.waitPhase(in.ID, api.InstanceStopped, api.ReasonTerminatedByOperator, time.Minute)
	if st := e.op(http.MethodDelete, "/api/v1/instances/"+in.ID, nil, nil); st != http.StatusAccepted {
		t.Fatalf("delete: HTTP %d", st)
	}
	e.waitGone(in.ID, time.Minute)
	p.noExceptions()
}

// isSubsequence reports whether want appears in got in order.
