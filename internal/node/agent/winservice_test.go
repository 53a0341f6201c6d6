package agent

import (
	"bytes"
	"errors"
	"reflect"
	"runtime"
	"slices"
	"strings"
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

// The SCM starts services in System32: relative paths are refused.
func TestServiceInstallRelativePaths(t *testing.T) {
	f := &fakeSCM{}
	code, _, errOut := runServiceCLI(t, f, "install", "-config", `agent.toml`, "-state-dir=D:\\drover", "-image-dirs", `C:\img,img2`)
	if code != 2 || !strings.Contains(errOut, `-config "agent.toml": give an absolute path`) ||
		!strings.Contains(errOut, `-image-dirs "img2"`) || strings.Contains(errOut, "state-dir") || len(f.calls) != 1 {
		t.Errorf("code %d, stderr %q, calls %v", code, errOut, f.calls)
	}
	for p, want := range map[string]bool{`C:\ProgramData\drover-agent\agent.toml`: true, `d:/x`: true,
		`\\srv\share\a.toml`: true, `agent.toml`: false, `C:agent.toml`: false, `/etc/x`: false, ``: false} {
		if got := windowsAbs(p); got != want {
			t.Errorf("windowsAbs(%q) = %v, want %v", p, got, want)
		}
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
