package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
)

// The Windows service: `drover-agent service install|uninstall|start|stop|
// status` (this file, platform-neutral so its command handling is tested
// on every platform; what install creates: winservice_spec.go), the
// agent's run under the service control manager (winservice_exec.go), and the calls into the SCM and the event log
// (winservice_windows.go; winservice_other.go refuses, pointing at the
// systemd unit and the rc.d script).

const (
	// ServiceName is the Windows service's name and its event log source.
	ServiceName        = "drover-agent"
	serviceDisplayName = "Drover node agent"
	serviceDescription = "Enrols this host with its Drover control plane, heartbeats and runs the signed tasks it is sent (docs/install.md)."
)

// errServiceNotInstalled is what serviceManager.Query returns when there
// is no service named ServiceName.
var errServiceNotInstalled = errors.New("service " + ServiceName + " is not installed")

// serviceState is a service's state as the SCM reports it.
type serviceState int

const (
	stateUnknown serviceState = iota
	stateStopped
	stateStartPending
	stateStopPending
	stateRunning
	stateOther // paused, pause or continue pending: the agent never asks for these
)

func (s serviceState) String() string {
	switch s {
	case stateStopped:
		return "stopped"
	case stateStartPending:
		return "start pending"
	case stateStopPending:
		return "stop pending"
	case stateRunning:
		return "running"
	case stateOther:
		return "paused or pause/continue pending"
	}
	return "unknown"
}

// serviceManager is the part of the service control manager the service
// commands use: the SCM on Windows (winservice_windows.go), a fake in
// tests. Install also registers the event log source, Remove removes it.
type serviceManager interface {
	Install(spec serviceSpec) error
	Remove() error
	Start() error
	Stop() error // sends the Stop control; does not wait
	Query() (serviceState, error)
	Close() error
}

// ServiceCommand is `drover-agent service SUBCOMMAND`; it returns the exit
// code: 0 done, 1 failed, 2 usage error or not Windows, 3 (status) not
// running or not installed.
func ServiceCommand(args []string, getenv func(string) string, runtimes noderuntime.Registry, stdout, stderr io.Writer) int {
	c := serviceCLI{connect: connectServiceManager, exe: os.Executable, getenv: getenv, runtimes: runtimes,
		stdout: stdout, stderr: stderr, poll: 500 * time.Millisecond, wait: 30 * time.Second, sleep: time.Sleep}
	return c.run(args)
}

const serviceUsage = `Usage: drover-agent service install [agent flags, e.g. -config C:\ProgramData\drover-agent\agent.toml]
       drover-agent service uninstall | start | stop | status

Windows only: runs drover-agent as the Windows service "drover-agent"
(Drover node agent), logging to the Application event log (source
drover-agent). On Linux use deploy/systemd/drover-agent.service, on
DragonFlyBSD deploy/rc.d/drover_agent (docs/install.md).

  install    create the service (automatic, delayed start; restarted 5s, 30s
             and 60s after a failure, the count reset after a day) running
             this binary with the agent flags given (checked first, as the
             agent reads them: give absolute paths), and register the
             event log source
  uninstall  stop the service if it runs, then delete it and the event
             log source (the state directory is kept)
  start      start the service and wait for it to report running
  stop       stop the service and wait for it to stop
  status     print the service's state; exit code 0 when running, 3 when
             stopped or not installed
`

// serviceCLI runs the service subcommands against a serviceManager.
type serviceCLI struct {
	connect        func() (serviceManager, error)
	exe            func() (string, error)
	getenv         func(string) string
	runtimes       noderuntime.Registry
	stdout, stderr io.Writer
	poll, wait     time.Duration // state polling while starting or stopping
	sleep          func(time.Duration)
}

func (c serviceCLI) fail(code int, format string, a ...any) int {
	fmt.Fprintf(c.stderr, "drover-agent service: "+format+"\n", a...)
	return code
}

func (c serviceCLI) run(args []string) int {
	if wantsHelp(args) || (len(args) > 0 && args[0] == "help") {
		fmt.Fprint(c.stdout, serviceUsage)
		return 0
	}
	if len(args) == 0 {
		fmt.Fprint(c.stderr, serviceUsage)
		return 2
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "install":
	case "uninstall", "start", "stop", "status":
		if len(rest) > 0 {
			return c.fail(2, "%s takes no arguments (agent flags belong to install), got %q", sub, strings.Join(rest, " "))
		}
	default:
		return c.fail(2, "unknown subcommand %q: install, uninstall, start, stop or status (--help)", sub)
	}
	m, err := c.connect()
	if errors.Is(err, errServiceUnsupported) {
		return c.fail(2, "%v", err)
	}
	if err != nil {
		return c.fail(1, "connect to the service control manager: %v", err)
	}
	defer m.Close()
	switch sub {
	case "install":
		return c.install(m, rest)
	case "uninstall":
		return c.uninstall(m)
	case "start":
		return c.start(m)
	case "stop":
		return c.stop(m)
	}
	return c.status(m)
}

func (c serviceCLI) install(m serviceManager, args []string) int {
	if err := absoluteServicePaths(args); err != nil {
		return c.fail(2, "%v", err)
	}
	if _, err := LoadConfig(args, c.getenv, c.runtimes); err != nil {
		return c.fail(2, "the agent would not start with these flags: %v\n(check with: drover-agent config show %s)", err, strings.Join(args, " "))
	}
	exe, err := c.exe()
	if err != nil {
		return c.fail(1, "this binary's path: %v", err)
	}
	spec := newServiceSpec(exe, args)
	if err := m.Install(spec); err != nil {
		return c.fail(1, "install: %v", err)
	}
	fmt.Fprintf(c.stdout, "installed service %s (%s): %s %s\nstart it with: drover-agent service start\n",
		spec.Name, spec.DisplayName, exe, strings.Join(args, " "))
	return 0
}

func (c serviceCLI) uninstall(m serviceManager) int {
	st, err := m.Query()
	if errors.Is(err, errServiceNotInstalled) {
		fmt.Fprintf(c.stdout, "service %s is not installed: nothing to do\n", ServiceName)
		return 0
	}
	if err != nil {
		return c.fail(1, "query: %v", err)
	}
	if st != stateStopped {
		if code := c.stop(m); code != 0 {
			return code
		}
	}
	if err := m.Remove(); err != nil {
		return c.fail(1, "uninstall: %v", err)
	}
	fmt.Fprintf(c.stdout, "uninstalled service %s (its state directory is kept)\n", ServiceName)
	return 0
}

func (c serviceCLI) start(m serviceManager) int {
	if err := m.Start(); err != nil {
		return c.fail(1, "start: %v", err)
	}
	st, err := c.waitFor(m, stateRunning)
	switch {
	case err != nil:
		return c.fail(1, "start: %v", err)
	case st == stateRunning:
		fmt.Fprintf(c.stdout, "service %s is running\n", ServiceName)
		return 0
	case st == stateStartPending:
		// Running comes once the agent has enrolled or loaded its identity.
		fmt.Fprintf(c.stdout, "service %s is starting: it reports running once the agent has enrolled with its control plane (see the event log, source %s)\n", ServiceName, ServiceName)
		return 0
	}
	return c.fail(1, "service %s is %s after start: see the Application event log, source %s", ServiceName, st, ServiceName)
}

func (c serviceCLI) stop(m serviceManager) int {
	st, err := m.Query()
	if err != nil {
		return c.fail(1, "query: %v", err)
	}
	if st == stateStopped {
		fmt.Fprintf(c.stdout, "service %s is already stopped\n", ServiceName)
		return 0
	}
	if st != stateStopPending {
		if err := m.Stop(); err != nil {
			return c.fail(1, "stop: %v", err)
		}
	}
	if st, err = c.waitFor(m, stateStopped); err != nil {
		return c.fail(1, "stop: %v", err)
	}
	if st != stateStopped {
		return c.fail(1, "service %s is still %s after %s", ServiceName, st, c.wait)
	}
	fmt.Fprintf(c.stdout, "service %s is stopped\n", ServiceName)
	return 0
}

func (c serviceCLI) status(m serviceManager) int {
	st, err := m.Query()
	if errors.Is(err, errServiceNotInstalled) {
		fmt.Fprintf(c.stdout, "service %s is not installed\n", ServiceName)
		return 3
	}
	if err != nil {
		return c.fail(1, "query: %v", err)
	}
	fmt.Fprintf(c.stdout, "service %s is %s\n", ServiceName, st)
	if st == stateRunning {
		return 0
	}
	return 3
}

// waitFor polls the service's state until it is want, or stopped, or
// c.wait has passed; it returns the last state seen.
func (c serviceCLI) waitFor(m serviceManager, want serviceState) (serviceState, error) {
	for i := 0; ; i++ {
		st, err := m.Query()
		if err != nil {
			return st, fmt.Errorf("query: %w", err)
		}
		if st == want || st == stateStopped || time.Duration(i)*c.poll >= c.wait {
			return st, nil
		}
		c.sleep(c.poll)
	}
}
