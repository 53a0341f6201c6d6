package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSCM is a serviceManager in memory: Query answers from states (the
// last one repeats) once Start or Stop has been called, else state.
type fakeSCM struct {
	installed bool
	state     serviceState
	states    []serviceState
	spec      serviceSpec
	calls     []string
	err       error // returned by Install, Start and Stop
}

func (f *fakeSCM) Install(spec serviceSpec) error {
	f.calls = append(f.calls, "install")
	f.spec, f.installed, f.state = spec, f.err == nil, stateStopped
	return f.err
}
func (f *fakeSCM) Remove() error {
	f.calls = append(f.calls, "remove")
	f.installed = false
	return nil
}
func (f *fakeSCM) Start() error { f.calls = append(f.calls, "start"); return f.err }
func (f *fakeSCM) Stop() error  { f.calls = append(f.calls, "stop"); return f.err }
func (f *fakeSCM) Close() error { f.calls = append(f.calls, "close"); return nil }
func (f *fakeSCM) Query() (serviceState, error) {
	f.calls = append(f.calls, "query")
	if !f.installed {
		return stateUnknown, errServiceNotInstalled
	}
	if slices.Contains(f.calls, "start") || slices.Contains(f.calls, "stop") {
		if len(f.states) > 1 {
			f.state, f.states = f.states[0], f.states[1:]
		} else if len(f.states) == 1 {
			f.state = f.states[0]
		}
	}
	return f.state, nil
}

// serviceEnv is a configuration the agent accepts.
func serviceEnv(k string) string {
	return map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": "https://cp.example:8443", "NODE_AGENT_BOOTSTRAP_TOKEN": "t",
		"NODE_AGENT_CA_HASH": "sha256:" + strings.Repeat("0", 64), "NODE_AGENT_ENV_FILE": "", "NODE_AGENT_RUNTIME": "none"}[k]
}

func runServiceCLI(t *testing.T, f *fakeSCM, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	c := serviceCLI{connect: func() (serviceManager, error) {
		if f == nil {
			t.Fatalf("service %v connected to the service manager", args)
		}
		return f, nil
	}, exe: func() (string, error) { return `C:\Program Files\Drover\drover-agent.exe`, nil },
		getenv: serviceEnv, stdout: &out, stderr: &errb, poll: time.Second, wait: 5 * time.Second, sleep: func(time.Duration) {}}
	code = c.run(args)
	return code, out.String(), errb.String()
}

// --help prints the usage and acts on nothing; usage errors exit 2
// before the service manager is contacted.
func TestServiceCommandHelpAndUsage(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"install", "--help"}, {"uninstall", "-help"}} {
		code, out, _ := runServiceCLI(t, nil, args...)
		if code != 0 || !strings.Contains(out, "Usage: drover-agent service install") {
			t.Errorf("%v: code %d, stdout %q", args, code, out)
		}
	}
	for _, args := range [][]string{{}, {"restart"}, {"start", "-config", "x"}, {"status", "extra"}} {
		code, _, errOut := runServiceCLI(t, nil, args...)
		if code != 2 || errOut == "" {
			t.Errorf("%v: code %d, stderr %q; want 2 and a message", args, code, errOut)
		}
	}
}

// Off Windows every subcommand exits 2, pointing at the platform's own
// service file.
func TestServiceCommandNotWindows(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has the service manager")
	}
	want := "deploy/systemd/drover-agent.service"
	if runtime.GOOS == "dragonfly" || runtime.GOOS == "freebsd" {
		want = "deploy/rc.d/drover_agent"
	}
	for _, sub := range []string{"install", "uninstall", "start", "stop", "status"} {
		var out, errb bytes.Buffer
		code := ServiceCommand([]string{sub}, serviceEnv, nil, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), want) || out.Len() != 0 {
			t.Errorf("service %s: code %d, stderr %q, stdout %q; want 2 and %s", sub, code, errb.String(), out.String(), want)
		}
	}
}

// install records the agent flags as the service's arguments, with an
// automatic delayed start and restarts after 5s, 30s and 60s.
func TestServiceInstall(t *testing.T) {
	f := &fakeSCM{}
	args := []string{"-listen", "127.0.0.1:9100", "-orchestrator", "cp.example:8443"}
	code, out, errOut := runServiceCLI(t, f, append([]string{"install"}, args...)...)
	if code != 0 {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	want := serviceSpec{Name: "drover-agent", DisplayName: "Drover node agent", Description: serviceDescription,
		Exe: `C:\Program Files\Drover\drover-agent.exe`, Args: args, AutoStart: true, DelayedAutoStart: true,
		Restarts: []time.Duration{5 * time.Second, 30 * time.Second, 60 * time.Second}, ResetAfter: 24 * time.Hour}
	if !reflect.DeepEqual(f.spec, want) {
		t.Errorf("spec = %+v\nwant %+v", f.spec, want)
	}
	if !strings.Contains(out, "drover-agent service start") {
		t.Errorf("stdout %q does not say how to start it", out)
	}

	f.err = errors.New("the service already exists")
	if code, _, errOut := runServiceCLI(t, f, "install"); code != 1 || !strings.Contains(errOut, "already exists") {
		t.Errorf("failed install: code %d, stderr %q", code, errOut)
	}
}

// Flags the agent would refuse are refused at install, not at start.
func TestServiceInstallBadFlags(t *testing.T) {
	f := &fakeSCM{}
	code, _, errOut := runServiceCLI(t, f, "install", "-no-such-flag")
	if code != 2 || !strings.Contains(errOut, "no-such-flag") || slices.Contains(f.calls, "install") {
		t.Errorf("code %d, stderr %q, calls %v", code, errOut, f.calls)
	}
}

// uninstall stops a running service first, and is a no-op when none is
// installed.
func TestServiceUninstall(t *testing.T) {
	f := &fakeSCM{installed: true, state: stateRunning, states: []serviceState{stateStopPending, stateStopped}}
	code, out, errOut := runServiceCLI(t, f, "uninstall")
	if code != 0 || !strings.Contains(out, "uninstalled") {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out, errOut)
	}
	stop, remove := slices.Index(f.calls, "stop"), slices.Index(f.calls, "remove")
	if stop < 0 || remove < stop || f.calls[remove-1] != "query" {
		t.Errorf("calls %v: want stop, wait for stopped, then remove", f.calls)
	}
	if code, out, _ := runServiceCLI(t, &fakeSCM{}, "uninstall"); code != 0 || !strings.Contains(out, "not installed") {
		t.Errorf("not installed: code %d, stdout %q", code, out)
	}
	stuck := &fakeSCM{installed: true, state: stateRunning, states: []serviceState{stateStopPending}}
	if code, _, _ := runServiceCLI(t, stuck, "uninstall"); code != 1 || slices.Contains(stuck.calls, "remove") {
		t.Errorf("stop timed out: code %d, calls %v; want 1 and no remove", code, stuck.calls)
	}
}

func TestServiceStartStopStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      *fakeSCM
		args   string
		code   int
		output string
	}{
		{"start", &fakeSCM{installed: true, state: stateStopped, states: []serviceState{stateStartPending, stateRunning}}, "start", 0, "is running"},
		{"start still enrolling", &fakeSCM{installed: true, state: stateStopped, states: []serviceState{stateStartPending}}, "start", 0, "is starting"},
		{"start fails", &fakeSCM{installed: true, state: stateStopped, states: []serviceState{stateStartPending, stateStopped}}, "start", 1, "event log"},
		{"start not installed", &fakeSCM{}, "start", 1, "not installed"},
		{"stop", &fakeSCM{installed: true, state: stateRunning, states: []serviceState{stateStopPending, stateStopped}}, "stop", 0, "is stopped"},
		{"stop stopped", &fakeSCM{installed: true, state: stateStopped}, "stop", 0, "already stopped"},
		{"stop stuck", &fakeSCM{installed: true, state: stateRunning, states: []serviceState{stateStopPending}}, "stop", 1, "still stop pending"},
		{"status running", &fakeSCM{installed: true, state: stateRunning}, "status", 0, "is running"},
		{"status stopped", &fakeSCM{installed: true, state: stateStopped}, "status", 3, "is stopped"},
		{"status not installed", &fakeSCM{}, "status", 3, "not installed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "start not installed" {
				tc.f.err = errServiceNotInstalled
			}
			code, out, errOut := runServiceCLI(t, tc.f, tc.args)
			if code != tc.code || !strings.Contains(out+errOut, tc.output) {
				t.Errorf("code %d, output %q; want %d and %q (calls %v)", code, out+errOut, tc.code, tc.output, tc.f.calls)
			}
			if tc.f.calls[len(tc.f.calls)-1] != "close" {
				t.Errorf("calls %v: the manager is not closed", tc.f.calls)
			}
		})
	}
}

// svcHarness runs a serviceRunner against a fake agent and collects its
// status reports.
type svcHarness struct {
	reqs     chan serviceCmd
	reports  chan serviceStatus
	ready    chan func()   // the agent's ready hook, once it runs
	finish   chan error    // what the agent returns after its context ends
	canceled chan struct{} // closed when the agent's context ends
	code     chan uint32
	logs     *bytes.Buffer
}

func startWinSvc(t *testing.T, tick, startTimeout time.Duration, agentErr error) *svcHarness {
	t.Helper()
	h := &svcHarness{reqs: make(chan serviceCmd), reports: make(chan serviceStatus, 100), ready: make(chan func(), 1),
		finish: make(chan error, 1), canceled: make(chan struct{}), code: make(chan uint32, 1), logs: &bytes.Buffer{}}
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: h.logs}, nil))
	run := func(ctx context.Context, ready func()) error {
		h.ready <- ready
		if agentErr != nil {
			return agentErr
		}
		<-ctx.Done()
		close(h.canceled)
		return <-h.finish
	}
	r := newServiceRunner(run, func(st serviceStatus) { h.reports <- st }, log)
	r.tick, r.startTimeout = tick, startTimeout
	go func() { h.code <- r.execute(h.reqs) }()
	return h
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (h *svcHarness) next(t *testing.T) serviceStatus {
	t.Helper()
	select {
	case st := <-h.reports:
		return st
	case <-time.After(5 * time.Second):
		t.Fatal("no status report")
	}
	return serviceStatus{}
}

func (h *svcHarness) exit(t *testing.T) uint32 {
	t.Helper()
	select {
	case c := <-h.code:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("execute did not return")
	}
	return 0
}

// StartPending, Running at the ready hook, Interrogate answered with the
// current status, then Stop or Shutdown: the agent's context ends,
// StopPending until it has returned, exit code 0.
func TestWinSvcRunnerStartRunningStop(t *testing.T) {
	for _, cmd := range []serviceCmd{cmdStop, cmdShutdown} {
		h := startWinSvc(t, time.Hour, time.Hour, nil)
		if st := h.next(t); st.State != stateStartPending || st.AcceptStop || st.CheckPoint != 1 || st.WaitHint <= 0 {
			t.Fatalf("first report %+v, want start pending with a wait hint, not accepting stop", st)
		}
		(<-h.ready)()
		running := serviceStatus{State: stateRunning, AcceptStop: true}
		if st := h.next(t); st != running {
			t.Fatalf("after ready: %+v, want %+v", st, running)
		}
		h.reqs <- cmdOther // not accepted: ignored
		h.reqs <- cmdInterrogate
		if st := h.next(t); st != running {
			t.Fatalf("interrogate: %+v, want %+v", st, running)
		}
		h.reqs <- cmd
		if st := h.next(t); st.State != stateStopPending || st.WaitHint <= 0 {
			t.Fatalf("after stop: %+v, want stop pending with a wait hint", st)
		}
		<-h.canceled
		h.finish <- context.Canceled
		if code := h.exit(t); code != 0 {
			t.Errorf("%v: exit code %d, want 0", cmd, code)
		}
	}
}

// While pending the checkpoint advances every tick.
func TestWinSvcRunnerCheckpoints(t *testing.T) {
	h := startWinSvc(t, 5*time.Millisecond, time.Hour, nil)
	for want := uint32(1); want <= 3; want++ {
		if st := h.next(t); st.State != stateStartPending || st.CheckPoint != want {
			t.Fatalf("report %+v, want start pending checkpoint %d", st, want)
		}
	}
	(<-h.ready)()
	for st := h.next(t); st.State != stateRunning; st = h.next(t) {
	}
	h.reqs <- cmdStop
	<-h.canceled
	last := uint32(0)
	for st := h.next(t); last < 3; st = h.next(t) {
		if st.State != stateStopPending || st.CheckPoint != last+1 {
			t.Fatalf("report %+v, want stop pending checkpoint %d", st, last+1)
		}
		last = st.CheckPoint
	}
	h.finish <- nil
	if code := h.exit(t); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}

// An agent that fails (before or after Running) exits non-zero, which the
// recovery actions restart; so does one not ready by the start timeout.
func TestWinSvcRunnerFailures(t *testing.T) {
	h := startWinSvc(t, time.Hour, time.Hour, errors.New("configuration: bad"))
	<-h.ready
	if code := h.exit(t); code != 1 || !strings.Contains(h.logs.String(), "configuration: bad") {
		t.Errorf("agent failed at start: code %d, logs %q", code, h.logs.String())
	}

	h = startWinSvc(t, time.Hour, 20*time.Millisecond, nil)
	<-h.ready
	<-h.canceled
	h.finish <- context.Canceled
	if code := h.exit(t); code != 1 || !strings.Contains(h.logs.String(), "did not become ready") {
		t.Errorf("start timeout: code %d, logs %q", code, h.logs.String())
	}

	h = startWinSvc(t, time.Hour, time.Hour, nil)
	(<-h.ready)()
	h.reqs <- cmdStop
	<-h.canceled
	h.finish <- fmt.Errorf("spool: %w", errors.New("disk full"))
	if code := h.exit(t); code != 1 || !strings.Contains(h.logs.String(), "disk full") {
		t.Errorf("failed stop: code %d, logs %q", code, h.logs.String())
	}
}

type fakeEventLog struct{ events []string }

func (f *fakeEventLog) Info(eid uint32, msg string) error    { return f.add("info", eid, msg) }
func (f *fakeEventLog) Warning(eid uint32, msg string) error { return f.add("warning", eid, msg) }
func (f *fakeEventLog) Error(eid uint32, msg string) error   { return f.add("error", eid, msg) }
func (f *fakeEventLog) add(kind string, eid uint32, msg string) error {
	f.events = append(f.events, fmt.Sprintf("%s %d %s", kind, eid, msg))
	return nil
}

// Info, Warn and Error reach the event log as logfmt without time and
// level (the event has its own); Debug does not.
func TestWinSvcEventLogHandler(t *testing.T) {
	el := &fakeEventLog{}
	log := slog.New(newEventLogHandler(el)).With("node_id", "n1")
	log.Debug("noise")
	log.Info("agent running", "control_plane", "https://cp:8443")
	log.WithGroup("hb").Warn("heartbeat failed", "attempt", 2)
	log.Error("agent stopped", "err", errors.New("boom"))
	want := []string{
		`info 1 msg="agent running" node_id=n1 control_plane=https://cp:8443`,
		`warning 2 msg="heartbeat failed" node_id=n1 hb.attempt=2`,
		`error 3 msg="agent stopped" node_id=n1 err=boom`,
	}
	if !reflect.DeepEqual(el.events, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(el.events, "\n"), strings.Join(want, "\n"))
	}
}
