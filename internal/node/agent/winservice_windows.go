//go:build windows

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/windows"
	"golang.org/x/sys/windows/svc"
	"golang.org/x/sys/windows/svc/eventlog"
	"golang.org/x/sys/windows/svc/mgr"

	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
)

// errServiceUnsupported is never returned on Windows.
var errServiceUnsupported = errors.New("windows services are supported")

// scm is the serviceManager of the Windows service control manager.
type scm struct{ m *mgr.Mgr }

func connectServiceManager() (serviceManager, error) {
	m, err := mgr.Connect()
	if err != nil {
		return nil, fmt.Errorf("%w (run it from an elevated prompt)", err)
	}
	return scm{m: m}, nil
}

func (s scm) Close() error { return s.m.Disconnect() }

func (s scm) open() (*mgr.Service, error) {
	sv, err := s.m.OpenService(ServiceName)
	if errors.Is(err, windows.ERROR_SERVICE_DOES_NOT_EXIST) {
		return nil, errServiceNotInstalled
	}
	if err != nil {
		return nil, fmt.Errorf("open service %s: %w", ServiceName, err)
	}
	return sv, nil
}

func (s scm) Install(spec serviceSpec) error {
	if sv, err := s.open(); err == nil {
		sv.Close()
		return fmt.Errorf("service %s is already installed (service uninstall first)", spec.Name)
	}
	c := mgr.Config{DisplayName: spec.DisplayName, Description: spec.Description,
		StartType: mgr.StartManual, ErrorControl: mgr.ErrorNormal, DelayedAutoStart: spec.DelayedAutoStart}
	if spec.AutoStart {
		c.StartType = mgr.StartAutomatic
	}
	sv, err := s.m.CreateService(spec.Name, spec.Exe, c, spec.Args...)
	if err != nil {
		return fmt.Errorf("create service %s: %w", spec.Name, err)
	}
	defer sv.Close()
	actions := make([]mgr.RecoveryAction, 0, len(spec.Restarts))
	for _, d := range spec.Restarts {
		actions = append(actions, mgr.RecoveryAction{Type: mgr.ServiceRestart, Delay: d})
	}
	err = sv.SetRecoveryActions(actions, uint32(spec.ResetAfter/time.Second))
	if err == nil {
		// A stop with a non-zero exit code (the agent failed) restarts it too.
		err = sv.SetRecoveryActionsOnNonCrashFailures(true)
	}
	if err == nil {
		err = eventlog.InstallAsEventCreate(spec.Name, eventlog.Error|eventlog.Warning|eventlog.Info)
		if err != nil && strings.Contains(err.Error(), "already exists") {
			err = nil // left by an earlier install: same source
		}
	}
	if err != nil {
		_ = sv.Delete()
		return fmt.Errorf("configure service %s (removed again): %w", spec.Name, err)
	}
	return nil
}

func (s scm) Remove() error {
	sv, err := s.open()
	if err != nil {
		return err
	}
	defer sv.Close()
	if err := sv.Delete(); err != nil {
		return fmt.Errorf("delete service %s: %w", ServiceName, err)
	}
	if err := eventlog.Remove(ServiceName); err != nil {
		return fmt.Errorf("service deleted; event log source %s: %w", ServiceName, err)
	}
	return nil
}

func (s scm) Start() error {
	sv, err := s.open()
	if err != nil {
		return err
	}
	defer sv.Close()
	return sv.Start()
}

func (s scm) Stop() error {
	sv, err := s.open()
	if err != nil {
		return err
	}
	defer sv.Close()
	if _, err := sv.Control(svc.Stop); err != nil {
		return fmt.Errorf("send stop: %w", err)
	}
	return nil
}

func (s scm) Query() (serviceState, error) {
	sv, err := s.open()
	if err != nil {
		return stateUnknown, err
	}
	defer sv.Close()
	st, err := sv.Query()
	if err != nil {
		return stateUnknown, fmt.Errorf("query service %s: %w", ServiceName, err)
	}
	switch st.State {
	case svc.Stopped:
		return stateStopped, nil
	case svc.StartPending:
		return stateStartPending, nil
	case svc.StopPending:
		return stateStopPending, nil
	case svc.Running:
		return stateRunning, nil
	}
	return stateOther, nil
}

// RunAsWindowsService runs the agent under the service control manager
// when it started this process (ran true, code the exit code); it logs to
// the event log (source ServiceName) and stderr. args are the agent flags
// recorded at install.
func RunAsWindowsService(args []string, getenv func(string) string, runtimes noderuntime.Registry) (code int, ran bool) {
	isSvc, err := svc.IsWindowsService()
	if err != nil || !isSvc {
		return 0, false
	}
	base, err := NewLogger(os.Stderr, getenv)
	if err != nil {
		base = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	log := base
	if el, err := eventlog.Open(ServiceName); err == nil {
		defer el.Close()
		log = slog.New(slog.NewMultiHandler(base.Handler(), newEventLogHandler(el)))
	}
	run := func(ctx context.Context, ready func()) error {
		cfg, err := LoadConfig(args, getenv, runtimes)
		if err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
		a, err := New(cfg, WithLogger(log), WithReadyHook(ready), WithMemoryRelease(ReleaseMemory))
		if err != nil {
			return err
		}
		return a.Run(ctx)
	}
	h := winHandler{runner: newServiceRunner(run, nil, log)}
	if err := svc.Run(ServiceName, h); err != nil {
		log.Error("service dispatcher", "err", err)
		return 1, true
	}
	return 0, true
}

// winHandler adapts serviceRunner to svc.Handler.
type winHandler struct{ runner serviceRunner }

func (h winHandler) Execute(_ []string, r <-chan svc.ChangeRequest, s chan<- svc.Status) (bool, uint32) {
	reqs := make(chan serviceCmd)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case c := <-r:
				cmd := cmdOther
				switch c.Cmd {
				case svc.Stop:
					cmd = cmdStop
				case svc.Shutdown:
					cmd = cmdShutdown
				case svc.Interrogate:
					cmd = cmdInterrogate
				}
				select {
				case reqs <- cmd:
				case <-done:
					return
				}
			case <-done:
				return
			}
		}
	}()
	runner := h.runner
	runner.report = func(st serviceStatus) { s <- toSvcStatus(st) }
	code := runner.execute(reqs)
	return code != 0, code
}

func toSvcStatus(st serviceStatus) svc.Status {
	out := svc.Status{CheckPoint: st.CheckPoint, WaitHint: uint32(st.WaitHint / time.Millisecond)}
	switch st.State {
	case stateStartPending:
		out.State = svc.StartPending
	case stateStopPending:
		out.State = svc.StopPending
	case stateRunning:
		out.State = svc.Running
	default:
		out.State = svc.Stopped
	}
	if st.AcceptStop {
		out.Accepts = svc.AcceptStop | svc.AcceptShutdown
	}
	return out
}
