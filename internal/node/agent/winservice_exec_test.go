package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

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
