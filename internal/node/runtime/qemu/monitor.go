package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// errNoQMP: the process runs but its QMP connection is down (a reconnect
// is in progress).
var errNoQMP = errors.New("qmp: not connected")

// errDetached: the runtime was closed while an operation waited.
var errDetached = errors.New("qemu: runtime closed")

// vmProc is one running QEMU process and what its QMP events said.
type vmProc struct {
	pid     int
	qmpPath string
	log     *slog.Logger

	ctx    context.Context // ends when the runtime lets go of the process (Close)
	cancel context.CancelFunc
	done   chan struct{} // closed once the process is gone and its exit recorded

	stopRequested atomic.Bool // Stop asked for it: the exit is "stopped"
	hard          atomic.Bool // Stop had to quit or kill it

	mu             sync.Mutex
	qmp            *qmpClient
	shutdownReason string // SHUTDOWN's reason ("guest-shutdown", "host-qmp-quit", ...)
	panicked       bool   // GUEST_PANICKED was seen
}

func newProc(pid int, qmpPath string, log *slog.Logger) *vmProc {
	ctx, cancel := context.WithCancel(context.Background())
	return &vmProc{pid: pid, qmpPath: qmpPath, log: log, ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

func (p *vmProc) detach() { p.cancel() }

func (p *vmProc) client() *qmpClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.qmp
}

func (p *vmProc) setClient(c *qmpClient) {
	p.mu.Lock()
	p.qmp = c
	p.mu.Unlock()
}

// execute runs a QMP command on the process's connection.
func (p *vmProc) execute(ctx context.Context, timeout time.Duration, cmd string, args, out any) error {
	c := p.client()
	if c == nil {
		return fmt.Errorf("%s: %w", cmd, errNoQMP)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Execute(ctx, cmd, args, out)
}

// onEvent records the events that decide how the process ended.
func (p *vmProc) onEvent(ev QMPEvent) {
	switch ev.Event {
	case "SHUTDOWN":
		var d shutdownEvent
		_ = json.Unmarshal(ev.Data, &d)
		p.mu.Lock()
		p.shutdownReason = d.Reason
		p.mu.Unlock()
		p.log.Info("qemu shutdown event", "guest", d.Guest, "reason", d.Reason)
	case "GUEST_PANICKED":
		p.mu.Lock()
		p.panicked = true
		p.mu.Unlock()
		p.log.Warn("guest panicked", "data", string(ev.Data))
	case "POWERDOWN", "RESET", "STOP", "RESUME":
		p.log.Debug("qemu event", "event", ev.Event)
	}
}

// verdict says how the process ended, from what Stop asked and QMP said.
func (p *vmProc) verdict() (runtime.State, api.ReasonCode, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopRequested.Load() && p.hard.Load():
		return runtime.StateStopped, "", "stopped on request (hard: quit or killed)"
	case p.stopRequested.Load():
		return runtime.StateStopped, "", "stopped on request"
	case p.panicked:
		return runtime.StateCrashed, "", "guest kernel panicked"
	case p.shutdownReason == "guest-shutdown":
		return runtime.StateStopped, "", "guest shut down"
	case p.shutdownReason != "":
		return runtime.StateCrashed, "", "qemu shut down unexpectedly: " + p.shutdownReason
	}
	return runtime.StateCrashed, "", "qemu exited without a shutdown event (killed?)"
}

// wait waits up to d for the process to be gone. A ctx that ends makes it
// return false early (the caller moves on to a harder stop).
func (p *vmProc) wait(ctx context.Context, d time.Duration) (bool, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, nil
	case <-p.ctx.Done():
		return false, errDetached
	}
}

// watch starts the monitor and readiness goroutines of a process.
func (r *Runtime) watch(in *instance, p *vmProc, serialOffset int64) {
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		r.monitor(in, p)
	}()
	go func() {
		defer r.wg.Done()
		r.watchReady(in, p, serialOffset)
	}()
}

// monitor owns the process's QMP connection: it reconnects when the
// connection is lost while the process lives, and records the exit once the
// process is gone.
func (r *Runtime) monitor(in *instance, p *vmProc) {
	for {
		c := p.client()
		if c == nil {
			if nc, err := dialQMP(p.ctx, p.qmpPath, 5*time.Second, p.onEvent); err == nil {
				p.setClient(nc)
				c = nc
			} else if p.ctx.Err() == nil {
				p.log.Warn("qmp reconnect failed", "err", err)
			}
		}
		var lost <-chan struct{}
		var retry <-chan time.Time
		if c != nil {
			lost = c.Done()
		} else {
			retry = time.After(time.Second)
		}
		select {
		case <-p.ctx.Done():
			if c := p.client(); c != nil {
				_ = c.Close()
			}
			return
		case <-lost:
			// QEMU closes QMP when it exits; give it time to be gone.
			if waitGone(p.ctx, p.pid, p.qmpPath, 5*time.Second) {
				r.exited(in, p)
				return
			}
			p.log.Warn("qmp connection lost while qemu runs; reconnecting")
			p.setClient(nil)
			_ = c.Close()
		case <-retry:
			if !processAlive(p.pid, p.qmpPath) {
				r.exited(in, p)
				return
			}
		}
	}
}

// exited records the end of a process and tells subscribers.
func (r *Runtime) exited(in *instance, p *vmProc) {
	state, reason, detail := p.verdict()
	if in.spec.VMOrZero().MicroVM {
		state, reason, detail = r.microvmVerdict(in, p.stopRequested.Load(), state, reason, detail)
	}
	if r.cgroupVerdict(in.id, p.stopRequested.Load()) {
		state, reason, detail = runtime.StateCrashed, api.ReasonOOMKilled, oomDetail
	}
	if c := p.client(); c != nil {
		_ = c.Close()
	}
	in.mu.Lock()
	tap := ""
	if in.proc == p {
		// Remove the pid file before a new Start can write one.
		_ = os.Remove(in.path(pidFileName))
		in.proc = nil
		in.ready = false
		tap = in.st.Tap
		in.st.State, in.st.PID, in.st.ExitedAt = state, 0, r.now()
		in.st.ExitReason, in.st.ExitDetail, in.st.StopRequested, in.st.Tap = reason, detail, false, ""
		if err := in.persistLocked(); err != nil {
			r.log.Error("persist state", "id", in.id, "err", err)
		}
	}
	in.mu.Unlock()
	if tap != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := removeTap(ctx, tap); err != nil {
			r.log.Warn("remove tap", "id", in.id, "tap", tap, "err", err)
		}
		cancel()
	}
	lvl := slog.LevelInfo
	if state == runtime.StateCrashed {
		lvl = slog.LevelWarn
	}
	r.log.Log(context.Background(), lvl, "instance exited", "id", in.id, "pid", p.pid, "state", state, "detail", detail)
	r.emit(runtime.Event{ID: in.id, Kind: runtime.EventExited, State: state, Reason: reason, Detail: detail})
	close(p.done)
}
