package firecracker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

const (
	ctrlAltDelEvery = 2 * time.Second  // a guest still booting misses the keypress: send it again
	killWait        = 10 * time.Second // after SIGKILL, before giving up
)

// Stop sends Ctrl+Alt+Del (PUT /actions SendCtrlAltDel: the guest reboots,
// which with reboot=k ends Firecracker) again every couple of seconds and
// waits up to graceful for the process to exit; then it kills it
// (SIGKILL) and reports HardStopped. graceful 0 kills at once. Stopping a
// stopped instance is a no-op. (SendCtrlAltDel exists on x86_64 only; on
// aarch64 the action fails and the stop waits, then kills.)
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
	p.stopRequested.Store(true)
	t0 := time.Now()
	deadline := t0.Add(graceful)
	for graceful > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := p.client.Action(actx, ActionSendCtrlAltDel); err != nil && p.alive() {
			r.log.Warn("SendCtrlAltDel failed", "id", in.id, "err", err)
		}
		cancel()
		if p.wait(ctx, min(ctrlAltDelEvery, time.Until(deadline))) {
			r.awaitExit(p)
			return runtime.StopResult{Took: time.Since(t0)}, nil
		}
	}
	if graceful > 0 {
		r.log.Warn("guest did not shut down in time; killing firecracker", "id", in.id, "graceful", graceful)
	}
	if err := killProcess(p.pid, p.key); err != nil {
		return runtime.StopResult{HardStopped: true}, fmt.Errorf("stop %s: kill %d: %w", in.id, p.pid, err)
	}
	if !p.wait(context.Background(), killWait) {
		return runtime.StopResult{HardStopped: true}, fmt.Errorf("stop %s: pid %d alive %v after SIGKILL", in.id, p.pid, killWait)
	}
	r.awaitExit(p)
	return runtime.StopResult{HardStopped: true, Took: time.Since(t0)}, nil
}

// awaitExit waits (up to 2s) for the monitor to record p's exit, so a
// caller that inspects after Stop sees the instance stopped.
func (r *Runtime) awaitExit(p *vmProc) {
	select {
	case <-p.gone:
	case <-time.After(2 * time.Second):
	}
}

// Destroy kills the instance if it runs and removes its state directory,
// rootfs copy, chroot, config drive, tap (through the TapProvider) and
// its lease on an OCI image. Files of an id
// this Runtime does not know are removed too, after killing its process.
// Destroying an unknown id is a no-op.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	unlock := r.lockID(id)
	defer unlock()
	if in := r.get(id); in != nil {
		if _, err := r.stopLocked(ctx, in, 0); err != nil {
			return fmt.Errorf("destroy %s: %w", id, err)
		}
	}
	dir := filepath.Join(r.instDir, id)
	st, _ := readState(dir)
	keys := []procKey{{"--api-sock", filepath.Join(dir, apiSockName)}}
	if st.JailID != "" {
		keys = append(keys, procKey{"--id", st.JailID})
	}
	procs := scanProcs(r.instDir)
	for _, k := range keys {
		pids := procs[k]
		if pid, err := readPidFile(filepath.Join(dir, pidFileName)); err == nil {
			pids = append(pids, pid)
		}
		for _, pid := range pids {
			if err := killProcess(pid, k); err != nil {
				return fmt.Errorf("destroy %s: kill %d: %w", id, pid, err)
			}
			if !waitGone(pid, k, killWait) {
				return fmt.Errorf("destroy %s: pid %d alive after SIGKILL", id, pid)
			}
		}
	}
	if st.Tap != "" && r.opts.Taps != nil {
		if err := r.opts.Taps.Release(ctx, id, st.Tap); err != nil {
			r.log.Warn("release tap", "id", id, "tap", st.Tap, "err", err)
		}
	}
	if st.Chroot != "" {
		if err := os.RemoveAll(filepath.Dir(st.Chroot)); err != nil {
			return fmt.Errorf("destroy %s: chroot: %w", id, err)
		}
	}
	if err := removeConfig(st); err != nil {
		return fmt.Errorf("destroy %s: config drive: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	if g := r.opts.Guest; g != nil && g.OCI != nil {
		if err := g.OCI.Release(id); err != nil { // its image may be evicted now
			r.log.Warn("release the instance's OCI image", "id", id, "err", err)
		}
	}
	r.mu.Lock()
	_, known := r.insts[id]
	delete(r.insts, id)
	r.mu.Unlock()
	if known {
		r.log.Info("instance destroyed", "id", id)
	}
	return nil
}

// Probe checks that the process lives, its API answers with the guest
// Running, and, with a readiness TCP port, that the guest accepts
// connections on its tap address.
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
	if !p.alive() {
		return fmt.Errorf("probe %s: process %d is gone", id, p.pid)
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := p.client.Describe(qctx)
	if err != nil {
		return fmt.Errorf("probe %s: %w", id, err)
	}
	if info.State != StateRunning {
		return fmt.Errorf("probe %s: guest is %q, not Running", id, info.State)
	}
	if in.spec.Readiness.TCPPort != 0 {
		if err := r.probeTCP(ctx, in); err != nil {
			return fmt.Errorf("probe %s: %w", id, err)
		}
	}
	return nil
}

func waitGone(pid int, k procKey, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for processAlive(pid, k) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// readPidFile reads the instance's pid file.
func readPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: bad content %q", path, b)
	}
	return pid, nil
}
