package firecracker

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

const (
	pollEvery           = 50 * time.Millisecond
	defaultReadyTimeout = 5 * time.Minute
)

// vmProc is a running firecracker the runtime watches: its own child
// (waited is cmd.Wait's answer) or an adopted one (polled through /proc).
type vmProc struct {
	pid    int
	key    procKey
	client *Client
	waited <-chan error // nil when adopted

	ctx    context.Context // ends on detach
	cancel context.CancelFunc
	gone   chan struct{} // closed once the process is gone

	stopRequested atomic.Bool
}

func newProc(pid int, key procKey, c *Client, waited <-chan error) *vmProc {
	ctx, cancel := context.WithCancel(context.Background())
	return &vmProc{pid: pid, key: key, client: c, waited: waited, ctx: ctx, cancel: cancel, gone: make(chan struct{})}
}

// detach stops watching without touching the process.
func (p *vmProc) detach() { p.cancel() }

// alive reports whether the process still runs.
func (p *vmProc) alive() bool {
	select {
	case <-p.gone:
		return false
	default:
	}
	return processAlive(p.pid, p.key)
}

// wait waits up to d for the process to be gone; false if it still runs.
func (p *vmProc) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.gone:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return !p.alive()
}

// watch starts the exit monitor and the readiness watcher of p.
func (r *Runtime) watch(in *instance, p *vmProc) {
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		r.monitor(in, p)
	}()
	go func() {
		defer r.wg.Done()
		r.watchReady(in, p)
	}()
}

// monitor waits for the process to end (or the runtime to let go) and
// records the exit: stopped when a stop was asked, crashed otherwise.
func (r *Runtime) monitor(in *instance, p *vmProc) {
	detail := ""
	if p.waited != nil {
		select {
		case err := <-p.waited:
			if err != nil {
				detail = err.Error()
			}
		case <-p.ctx.Done():
			return
		}
	} else {
		t := time.NewTicker(pollEvery)
		defer t.Stop()
		for processAlive(p.pid, p.key) {
			select {
			case <-p.ctx.Done():
				return
			case <-t.C:
			}
		}
	}
	defer close(p.gone) // after the exit is recorded
	in.mu.Lock()
	if in.proc != p {
		in.mu.Unlock()
		return
	}
	in.proc, in.ready = nil, false
	in.st.PID, in.st.ExitedAt = 0, r.now()
	if p.stopRequested.Load() || in.st.StopRequested {
		in.st.State, in.st.ExitDetail = runtime.StateStopped, "stopped on request"
	} else {
		in.st.State = runtime.StateCrashed
		in.st.ExitDetail = "firecracker exited"
		if detail != "" {
			in.st.ExitDetail += " (" + detail + ")"
		}
		if tail := logTail(in.path(serialLogName), in.st.SerialOffset, 512); tail != "" {
			in.st.ExitDetail += ": " + tail
		}
	}
	in.st.StopRequested = false
	st := in.st
	if err := in.persistLocked(); err != nil {
		r.log.Error("persist state", "id", in.id, "err", err)
	}
	in.mu.Unlock()
	_ = os.Remove(in.path(pidFileName))
	r.log.Info("instance exited", "id", in.id, "pid", p.pid, "state", st.State, "detail", st.ExitDetail)
	r.emit(runtime.Event{ID: in.id, Kind: runtime.EventExited, State: st.State, Reason: st.ExitReason, Detail: st.ExitDetail})
}

// watchReady marks the instance Ready once per start: the serial marker in
// serial.log, the readiness TCP port answering on the guest's tap address,
// or, with neither, the API saying Running.
func (r *Runtime) watchReady(in *instance, p *vmProc) {
	rd := in.spec.Readiness
	timeout := time.Duration(rd.Timeout)
	if timeout <= 0 {
		timeout = defaultReadyTimeout
	}
	deadline := time.Now().Add(timeout)
	in.mu.Lock()
	off := in.st.SerialOffset
	in.mu.Unlock()
	var tail *markerTail
	if rd.SerialMarker != "" {
		tail = &markerTail{path: in.path(serialLogName), off: off, marker: []byte(rd.SerialMarker)}
	}
	markerOK, tcpOK := tail == nil, rd.TCPPort == 0
	for {
		if !markerOK {
			markerOK = tail.found()
		}
		if markerOK && !tcpOK {
			tcpOK = r.probeTCP(p.ctx, in) == nil
		}
		if markerOK && tcpOK && (tail != nil || rd.TCPPort != 0 || r.apiRunning(p.ctx, p)) {
			r.markReady(in, p)
			return
		}
		if time.Now().After(deadline) {
			r.log.Warn("instance not ready within its readiness timeout", "id", in.id, "timeout", timeout)
			return
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.gone:
			return
		case <-time.After(pollEvery):
		}
	}
}

func (r *Runtime) apiRunning(ctx context.Context, p *vmProc) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	i, err := p.client.Describe(ctx)
	return err == nil && i.State == StateRunning
}

func (r *Runtime) markReady(in *instance, p *vmProc) {
	in.mu.Lock()
	first := in.proc == p && !in.ready
	if first {
		in.ready = true
	}
	in.mu.Unlock()
	if first {
		r.log.Info("instance ready", "id", in.id, "pid", p.pid)
		r.emit(runtime.Event{ID: in.id, Kind: runtime.EventReady, State: runtime.StateRunning})
	}
}

// probeTCP dials the readiness port on the guest's tap address.
func (r *Runtime) probeTCP(ctx context.Context, in *instance) error {
	in.mu.Lock()
	ip := in.st.GuestIP
	in.mu.Unlock()
	port := in.spec.Readiness.TCPPort
	if ip == "" {
		return fmt.Errorf("readiness tcp_port %d: the guest's address is unknown (no TapProvider gave one)", port)
	}
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("guest %s port %d: %w", ip, port, err)
	}
	return c.Close()
}

// markerTail finds a marker in a growing file, reading only new bytes.
type markerTail struct {
	path   string
	off    int64
	marker []byte
	carry  []byte
}

func (m *markerTail) found() bool {
	f, err := os.Open(m.path)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	if fi, err := f.Stat(); err == nil && fi.Size() < m.off {
		m.off, m.carry = 0, nil
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := f.ReadAt(buf, m.off)
		if n > 0 {
			m.off += int64(n)
			data := append(m.carry, buf[:n]...)
			if bytes.Contains(data, m.marker) {
				return true
			}
			keep := min(len(m.marker)-1, len(data))
			m.carry = append([]byte(nil), data[len(data)-keep:]...)
		}
		if err != nil || n == 0 {
			return false
		}
	}
}
