package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Readiness polling.
const (
	defaultReadyTimeout = 5 * time.Minute
	serialPoll          = 20 * time.Millisecond
	tcpPoll             = 250 * time.Millisecond
)

// watchReady waits for the instance's readiness condition and marks it
// Ready once per start: the serial marker appears in serial.log after
// serialOffset, and/or the readiness TCP port accepts connections in the
// guest; with neither, QMP query-status says running. It gives up when the
// process ends, the runtime lets go, or Readiness.Timeout (default 5m)
// passes.
func (r *Runtime) watchReady(in *instance, p *vmProc, serialOffset int64) {
	rd := in.spec.Readiness
	timeout := time.Duration(rd.Timeout)
	if timeout <= 0 {
		timeout = defaultReadyTimeout
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(serialPoll)
	defer tick.Stop()

	markerOK, tcpOK := rd.SerialMarker == "", rd.TCPPort == 0
	statusOK := !markerOK || !tcpOK
	var tail *markerTail
	if !markerOK {
		tail = &markerTail{path: in.path(serialLogName), off: serialOffset, marker: []byte(rd.SerialMarker)}
	}
	var lastTCP time.Time
	for {
		if !markerOK {
			markerOK = tail.found()
		}
		if markerOK && !tcpOK && time.Since(lastTCP) >= tcpPoll {
			lastTCP = time.Now()
			tcpOK = r.probeReadiness(p.ctx, in, p) == nil
		}
		if !statusOK {
			var s statusInfo
			statusOK = p.execute(p.ctx, 2*time.Second, "query-status", nil, &s) == nil && s.Running
		}
		if markerOK && tcpOK && statusOK {
			r.markReady(in, p)
			return
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.done:
			return
		case <-deadline.C:
			r.log.Warn("instance not ready within its readiness timeout; no longer watching",
				"id", in.id, "timeout", timeout, "serial_marker", markerOK, "tcp", tcpOK)
			return
		case <-tick.C:
		}
	}
}

// markReady sets Ready and emits EventReady, once per process.
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

// markerTail finds a marker in a growing file, reading only new bytes.
type markerTail struct {
	path   string
	off    int64
	marker []byte
	carry  []byte // the last len(marker)-1 bytes already read
}

func (m *markerTail) found() bool {
	f, err := os.Open(m.path)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	if fi, err := f.Stat(); err == nil && fi.Size() < m.off {
		m.off, m.carry = 0, nil // truncated or replaced
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

// probeTCP checks that the guest accepts connections on the readiness port.
// With user networking QEMU's host side accepts any connection at once and
// only then connects in the guest, so a successful dial proves nothing: the
// connection must reach ESTABLISHED in QEMU's slirp table (`info usernet`),
// while a guest that refuses makes QEMU close it.
func (r *Runtime) probeTCP(ctx context.Context, in *instance, p *vmProc) error {
	guestPort := in.spec.Readiness.TCPPort
	addr, direct, err := probeAddr(in, guestPort)
	if err != nil {
		return err
	}
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dial guest port %d (%s): %w", guestPort, addr, err)
	}
	defer func() { _ = conn.Close() }()
	if direct {
		return nil // the guest itself accepted
	}
	deadline := time.Now().Add(2 * time.Second)
	one := make([]byte, 1)
	for {
		var table string
		err := p.execute(ctx, 2*time.Second, "human-monitor-command", map[string]string{"command-line": "info usernet"}, &table)
		if err != nil {
			return fmt.Errorf("info usernet: %w", err)
		}
		if establishedTo(table, guestPort) {
			return nil
		}
		_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := conn.Read(one)
		switch {
		case n > 0:
			return nil // the guest spoke first
		case errors.Is(err, io.EOF) || isConnReset(err):
			return fmt.Errorf("guest port %d refused the connection", guestPort)
		case time.Now().After(deadline):
			return fmt.Errorf("guest port %d did not answer", guestPort)
		}
	}
}

// establishedTo reports whether `info usernet` lists an established TCP
// connection to guestPort.
func establishedTo(table string, guestPort int) bool {
	want := strconv.Itoa(guestPort)
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[0] == "TCP[ESTABLISHED]" && f[5] == want {
			return true
		}
	}
	return false
}

func isConnReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
