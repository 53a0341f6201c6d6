package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Stop timing.
const (
	// A press of the power button is lost when the guest is not listening
	// yet (still booting, ACPI button driver or acpid not up): the graceful
	// stop presses it again, first after powerdownFirst, then at intervals
	// growing to powerdownMax, until its deadline.
	powerdownFirst = time.Second
	powerdownMax   = 2 * time.Second
	quitWait       = 3 * time.Second  // after QMP quit, before SIGKILL
	killWait       = 30 * time.Second // after SIGKILL, before giving up
)

// Stop asks the guest to power off (QMP system_powerdown, the ACPI power
// button), pressing the button again every second or two, as `virsh
// shutdown` in a loop does, and waits up to graceful for QEMU to exit; then
// it sends QMP quit and, a few seconds later, SIGKILL, and reports
// HardStopped. It returns only once the process is gone. graceful 0 skips
// the powerdown; a ctx that ends cuts the graceful wait short. Stopping a
// stopped instance is a no-op.
func (r *Runtime) Stop(ctx context.Context, id string, graceful time.Duration) (runtime.StopResult, error) {
	unlock := r.lockID(id)
	defer unlock()
	in := r.get(id)
	if in == nil {
		return runtime.StopResult{}, notFound("stop", id)
	}
	return r.stopLocked(ctx, in, graceful)
}

func (r *Runtime) stopLocked(ctx context.Context, in *instance, graceful time.Duration) (runtime.StopResult, error) {
	in.mu.Lock()
	p := in.proc
	if p != nil {
		in.st.StopRequested = true
		if err := in.persistLocked(); err != nil {
			r.log.Error("persist state", "id", in.id, "err", err)
		}
	}
	in.mu.Unlock()
	if p == nil {
		return runtime.StopResult{}, nil
	}
	t0 := time.Now()
	p.stopRequested.Store(true)
	if graceful > 0 {
		gone, err := p.powerdown(ctx, t0.Add(graceful))
		if err != nil {
			return runtime.StopResult{}, fmt.Errorf("stop %s: %w", in.id, err)
		}
		if gone {
			return runtime.StopResult{Took: time.Since(t0)}, nil
		}
		p.log.Warn("guest did not power off in time; stopping hard", "graceful", graceful)
	}
	p.hard.Store(true)
	bg := context.Background()
	if err := p.execute(bg, 2*time.Second, "quit", nil, nil); err != nil && !errors.Is(err, ErrQMPClosed) {
		p.log.Warn("qmp quit failed", "err", err)
	}
	gone, err := p.wait(bg, quitWait)
	if err != nil {
		return runtime.StopResult{}, fmt.Errorf("stop %s: %w", in.id, err)
	}
	if !gone {
		p.log.Warn("qemu still running after quit; killing it")
		if err := killProcess(p.pid, p.qmpPath); err != nil {
			return runtime.StopResult{HardStopped: true}, fmt.Errorf("stop %s: kill %d: %w", in.id, p.pid, err)
		}
		if gone, err = p.wait(bg, killWait); err != nil {
			return runtime.StopResult{}, fmt.Errorf("stop %s: %w", in.id, err)
		}
		if !gone {
			return runtime.StopResult{HardStopped: true}, fmt.Errorf("stop %s: pid %d alive %v after SIGKILL", in.id, p.pid, killWait)
		}
	}
	return runtime.StopResult{HardStopped: true, Took: time.Since(t0)}, nil
}

// powerdown presses the ACPI power button (QMP system_powerdown) until the
// process is gone or deadline passes, pressing again after powerdownFirst
// and then at intervals doubling up to powerdownMax. A press that fails
// (QMP reconnecting, QEMU exiting) is logged and retried at the next
// interval. It reports whether the process is gone; a ctx that ends makes
// it return false at once.
func (p *vmProc) powerdown(ctx context.Context, deadline time.Time) (bool, error) {
	interval := powerdownFirst
	for presses := 1; ; presses++ {
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		if err := p.execute(ctx, min(5*time.Second, left), "system_powerdown", nil, nil); err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			p.log.Warn("system_powerdown failed", "press", presses, "err", err)
		} else if presses > 1 {
			p.log.Debug("power button pressed again", "press", presses)
		}
		next := min(interval, time.Until(deadline))
		gone, err := p.wait(ctx, next)
		if gone || err != nil || ctx.Err() != nil {
			return gone, err
		}
		interval = min(2*interval, powerdownMax)
	}
}

// Destroy kills the instance if it runs and removes its overlay, seed,
// sockets, tap device and state directory. Files of an id this Runtime does
// not know (not recovered) are removed too, after killing their QEMU.
// Destroying an unknown id is a no-op.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil // such an id cannot have been created
	}
	unlock := r.lockID(id)
	defer unlock()
	if in := r.get(id); in != nil {
		if _, err := r.stopLocked(ctx, in, 0); err != nil {
			return fmt.Errorf("destroy %s: %w", id, err)
		}
		in.closeSeed()
	}
	dir := filepath.Join(r.instDir, id)
	qmpPath := filepath.Join(dir, qmpSock)
	// A QEMU nobody watches (not recovered, or a duplicate) dies first: a
	// QEMU must never outlive its instance directory.
	pids := scanQEMU(r.instDir)[qmpPath]
	if pid, err := readPidFile(filepath.Join(dir, pidFileName)); err == nil {
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		if err := killProcess(pid, qmpPath); err != nil {
			return fmt.Errorf("destroy %s: kill %d: %w", id, pid, err)
		}
		if !waitGone(ctx, pid, qmpPath, killWait) {
			return fmt.Errorf("destroy %s: pid %d still alive after SIGKILL", id, pid)
		}
	}
	r.removeCgroup(id)
	st, _ := readState(dir)
	r.detachVolumes(id, st.Volumes) // the QEMU is gone; the volumes stay
	if st.Tap != "" {
		if err := removeTap(ctx, st.Tap); err != nil {
			r.log.Warn("remove tap", "id", id, "tap", st.Tap, "err", err)
		}
	}
	if mv := r.opts.MicroVM; st.LeaseIP != "" && mv != nil && mv.Net != nil {
		// A microVM in mode bridge: its tap, forwards and address.
		if err := mv.Net.Release(ctx, id); err != nil {
			return fmt.Errorf("destroy %s: %w", id, err)
		}
	}
	for _, p := range []string{st.Overlay, filepath.Join(r.overlayDir, id+".qcow2")} {
		if p != "" {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("destroy %s: overlay: %w", id, err)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	if mv := r.opts.MicroVM; mv != nil && mv.OCI != nil {
		if err := mv.OCI.Release(id); err != nil { // its image may be evicted now
			r.log.Warn("release the instance's OCI image", "id", id, "err", err)
		}
	}
	if r.get(id) != nil {
		r.forget(id)
		r.log.Info("instance destroyed", "id", id)
	}
	return nil
}

// Probe checks that the process lives, the guest runs (QMP query-status)
// and, with a readiness TCP port, that the guest passes the readiness
// probe again: an HTTP GET of Readiness.HTTPPath when set (a 2xx or 3xx
// answer), else a connection accepted on the port.
func (r *Runtime) Probe(ctx context.Context, id string) error {
	in := r.get(id)
	if in == nil {
		return notFound("probe", id)
	}
	in.mu.Lock()
	p := in.proc
	in.mu.Unlock()
	if p == nil {
		return fmt.Errorf("probe %s: not running", id)
	}
	if !processAlive(p.pid, p.qmpPath) {
		return fmt.Errorf("probe %s: process %d is gone", id, p.pid)
	}
	var s statusInfo
	if err := p.execute(ctx, 5*time.Second, "query-status", nil, &s); err != nil {
		return fmt.Errorf("probe %s: %w", id, err)
	}
	if !s.Running {
		return fmt.Errorf("probe %s: guest is %s, not running", id, s.Status)
	}
	if in.spec.Readiness.TCPPort != 0 {
		if err := r.probeReadiness(ctx, in, p); err != nil {
			return fmt.Errorf("probe %s: %w", id, err)
		}
	}
	return nil
}
