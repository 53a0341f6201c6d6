package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// WithReadyHook calls ready once the agent has enrolled (or loaded its
// identity) and started its loops: the moment systemd is sent READY=1.
// The Windows service reports Running then.
func WithReadyHook(ready func()) Option { return func(a *Agent) { a.onReady = ready } }

// serviceCmd is a control request from the SCM, platform-neutral.
type serviceCmd int

const (
	cmdStop serviceCmd = iota + 1
	cmdShutdown
	cmdInterrogate
	cmdOther // a control the agent does not accept
)

// serviceStatus is a status report to the SCM, platform-neutral.
type serviceStatus struct {
	State      serviceState
	AcceptStop bool // accepts Stop and Shutdown (only while running)
	CheckPoint uint32
	WaitHint   time.Duration
}

// serviceRunner is the service handler's logic (svc.Handler.Execute on
// Windows): it runs the agent, reports StartPending (with a checkpoint
// every tick), Running once the agent is ready, and on Stop or Shutdown
// cancels the agent and reports StopPending (checkpoints again) until it
// has ended. svc.Run reports Stopped, with the exit code, when execute
// returns.
type serviceRunner struct {
	run    func(ctx context.Context, ready func()) error // the agent
	report func(serviceStatus)
	log    *slog.Logger
	// tick is the checkpoint interval of the pending states; the wait hint
	// is three ticks. startTimeout bounds StartPending: as systemd's
	// TimeoutStartSec, an agent not ready by then is stopped with a
	// failure, which the recovery actions restart.
	tick, startTimeout time.Duration
}

func newServiceRunner(run func(context.Context, func()) error, report func(serviceStatus), log *slog.Logger) serviceRunner {
	return serviceRunner{run: run, report: report, log: log, tick: 5 * time.Second, startTimeout: 5 * time.Minute}
}

// execute runs until the agent has ended and returns the exit code: 0
// after a requested stop, 1 when the agent failed or ended on its own.
func (r serviceRunner) execute(reqs <-chan serviceCmd) uint32 {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyC := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() { done <- r.run(ctx, func() { once.Do(func() { close(readyC) }) }) }()

	st := serviceStatus{State: stateStartPending, CheckPoint: 1, WaitHint: 3 * r.tick}
	r.report(st)
	ticker := time.NewTicker(r.tick)
	defer ticker.Stop()
	startTimer := time.NewTimer(r.startTimeout)
	defer startTimer.Stop()
	ready := (<-chan struct{})(readyC)
	for {
		select {
		case <-ready:
			ready = nil
			startTimer.Stop()
			st = serviceStatus{State: stateRunning, AcceptStop: true}
			r.report(st)
			r.log.Info("service running")
		case <-ticker.C:
			if st.State == stateStartPending {
				st.CheckPoint++
				r.report(st)
			}
		case <-startTimer.C:
			if st.State == stateStartPending {
				r.log.Error("the agent did not become ready in time (enrolment waits on the control plane?); stopping so the service is restarted",
					"timeout", r.startTimeout)
				cancel()
				r.stopping(reqs, done)
				return 1
			}
		case c := <-reqs:
			switch c {
			case cmdInterrogate:
				r.report(st)
			case cmdStop, cmdShutdown:
				r.log.Info("service stop requested", "shutdown", c == cmdShutdown)
				cancel()
				if err := r.stopping(reqs, done); err != nil {
					r.log.Error("agent stopped", "err", err)
					return 1
				}
				return 0
			default:
				r.log.Warn("service control not accepted", "control", int(c))
			}
		case err := <-done:
			if err == nil {
				err = errors.New("the agent ended on its own")
			}
			r.log.Error("agent stopped", "err", err)
			return 1
		}
	}
}

// stopping reports StopPending until the agent has ended and returns its
// error (nil for a clean stop or a cancellation).
func (r serviceRunner) stopping(reqs <-chan serviceCmd, done <-chan error) error {
	st := serviceStatus{State: stateStopPending, CheckPoint: 1, WaitHint: 3 * r.tick}
	r.report(st)
	ticker := time.NewTicker(r.tick)
	defer ticker.Stop()
	for {
		select {
		case err := <-done:
			if errors.Is(err, context.Canceled) {
				err = nil
			}
			return err
		case <-ticker.C:
			st.CheckPoint++
			r.report(st)
		case c := <-reqs:
			if c == cmdInterrogate {
				r.report(st)
			}
		}
	}
}

// eventWriter is the event log (eventlog.Log on Windows).
type eventWriter interface {
	Info(eid uint32, msg string) error
	Warning(eid uint32, msg string) error
	Error(eid uint32, msg string) error
}

// Event ids (1..1000: EventCreate.exe is the source's message file).
const (
	eventIDInfo  = 1
	eventIDWarn  = 2
	eventIDError = 3
)

// eventLogHandler is a slog.Handler writing Info, Warn and Error records
// to the event log as logfmt lines without the time (the event log has
// its own). Handlers derived with WithAttrs/WithGroup share one sink.
type eventLogHandler struct {
	text slog.Handler // formats into sink
	sink *eventSink
}

type eventSink struct {
	mu  sync.Mutex // held across one record: buf belongs to it
	w   eventWriter
	buf bytes.Buffer
}

func (s *eventSink) Write(p []byte) (int, error) { return s.buf.Write(p) }

func newEventLogHandler(w eventWriter) *eventLogHandler {
	s := &eventSink{w: w}
	text := slog.NewTextHandler(s, &slog.HandlerOptions{Level: slog.LevelInfo,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
				return slog.Attr{} // the event's own time and type carry these
			}
			return a
		}})
	return &eventLogHandler{text: text, sink: s}
}

func (h *eventLogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.text.Enabled(ctx, l)
}

func (h *eventLogHandler) Handle(ctx context.Context, rec slog.Record) error {
	s := h.sink
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Reset()
	if err := h.text.Handle(ctx, rec); err != nil {
		return err
	}
	msg := string(bytes.TrimRight(s.buf.Bytes(), "\n"))
	var err error
	switch {
	case rec.Level >= slog.LevelError:
		err = s.w.Error(eventIDError, msg)
	case rec.Level >= slog.LevelWarn:
		err = s.w.Warning(eventIDWarn, msg)
	default:
		err = s.w.Info(eventIDInfo, msg)
	}
	return err
}

func (h *eventLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &eventLogHandler{text: h.text.WithAttrs(as), sink: h.sink}
}

func (h *eventLogHandler) WithGroup(name string) slog.Handler {
	return &eventLogHandler{text: h.text.WithGroup(name), sink: h.sink}
}
