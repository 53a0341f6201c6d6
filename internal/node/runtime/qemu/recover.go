package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Recover re-adopts the instances under Root after an agent restart. A
// live QEMU (its pid file names a process whose command line has the
// instance's QMP socket) is adopted: QMP is reconnected, watching resumes
// (Ready at once if the marker is already in serial.log), Status.Adopted is
// set, and no second QEMU is ever started. An instance whose QEMU died while
// nobody watched becomes stopped (if a stop had been asked) or crashed. A
// half-created instance (no spec.json) is removed, and on Linux every QEMU
// whose instance directory is gone, or that duplicates an adopted one, is
// killed. With Options.Cgroups, the empty cgroups of instances that no
// longer exist are removed last, as are (microVMs in mode bridge) the
// network leases, taps and DNAT rules of instances that no longer exist.
func (r *Runtime) Recover(ctx context.Context) ([]runtime.Status, error) {
	entries, err := os.ReadDir(r.instDir)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	procs := scanQEMU(r.instDir)
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !runtime.ValidID(e.Name()) {
			continue
		}
		if err := r.recoverLocked(ctx, e.Name(), procs); err != nil {
			r.log.Error("recover instance", "id", e.Name(), "err", err)
			errs = append(errs, err)
		}
	}
	for qmpPath, pids := range procs {
		if _, err := os.Stat(filepath.Dir(qmpPath)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		for _, pid := range pids {
			r.log.Warn("killing a qemu whose instance directory is gone", "pid", pid, "qmp", qmpPath)
			if err := killProcess(pid, qmpPath); err != nil {
				errs = append(errs, fmt.Errorf("recover: kill orphan qemu %d: %w", pid, err))
			}
		}
	}
	list, _ := r.List(ctx)
	live := make([]string, 0, len(list))
	for _, s := range list {
		live = append(live, s.ID)
	}
	r.reconcileVolumes() // holders of microVMs that are gone
	if mv := r.opts.MicroVM; mv != nil && mv.Net != nil {
		// Leases, taps and rules of microVMs that are gone.
		if rep, err := mv.Net.Reconcile(ctx, live); err != nil {
			r.log.Warn("reconcile microVM networking", "err", err)
		} else if len(rep.Released) > 0 || len(rep.TapsRemoved) > 0 || rep.RulesFreed > 0 {
			r.log.Info("freed orphan microVM networking", "released", rep.Released, "taps", rep.TapsRemoved, "rules", rep.RulesFreed)
		}
	}
	if r.opts.Cgroups != nil {
		// Cgroups of instances that are gone (a crash between a destroy's
		// steps) are removed; live instances keep theirs.
		if removed, err := r.opts.Cgroups.Reconcile(live); err != nil {
			r.log.Warn("reconcile cgroups", "err", err)
		} else if len(removed) > 0 {
			r.log.Info("removed orphan cgroups", "ids", removed)
		}
	}
	return list, errors.Join(errs...)
}

func (r *Runtime) recoverLocked(ctx context.Context, id string, procs map[string][]int) error {
	unlock := r.lockID(id)
	defer unlock()
	return r.recoverOne(ctx, id, procs)
}

// recoverOne loads id from disk unless it is known already; the id lock is
// held.
func (r *Runtime) recoverOne(ctx context.Context, id string, procs map[string][]int) error {
	if r.get(id) != nil {
		return nil
	}
	dir := filepath.Join(r.instDir, id)
	qmpPath := filepath.Join(dir, qmpSock)
	spec, err := readSpec(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return nil // nothing there
		}
		// Create did not finish: nothing was started from it.
		r.log.Warn("removing a half-created instance", "id", id)
		for _, pid := range procs[qmpPath] {
			_ = killProcess(pid, qmpPath)
		}
		_ = os.Remove(filepath.Join(r.overlayDir, id+".qcow2"))
		return os.RemoveAll(dir)
	}
	if err != nil {
		return err
	}
	st, err := readState(dir)
	if err != nil {
		return err
	}
	in := &instance{id: id, dir: dir, spec: spec, st: st}

	// The live QEMU: the pid file's, or (Linux) one found by its socket.
	candidates := procs[qmpPath]
	if pid, err := readPidFile(in.path(pidFileName)); err == nil {
		candidates = append([]int{pid}, candidates...)
	}
	pid := 0
	for _, c := range candidates {
		if processAlive(c, qmpPath) {
			pid = c
			break
		}
	}
	for _, c := range candidates {
		if c != pid && processAlive(c, qmpPath) {
			r.log.Warn("killing a duplicate qemu", "id", id, "pid", c, "adopted", pid)
			_ = killProcess(c, qmpPath)
		}
	}

	if pid == 0 {
		if in.st.State == runtime.StateRunning {
			in.st.State, in.st.ExitDetail = runtime.StateCrashed, "qemu exited while the agent was not watching"
			if in.st.StopRequested {
				in.st.State, in.st.ExitDetail = runtime.StateStopped, "stopped on request (while the agent was not watching)"
			}
			in.st.PID, in.st.ExitedAt, in.st.StopRequested = 0, r.now(), false
			if in.st.Tap != "" {
				_ = removeTap(ctx, in.st.Tap)
				in.st.Tap = ""
			}
			_ = os.Remove(in.path(pidFileName))
			if err := in.persistLocked(); err != nil {
				return err
			}
		}
		r.put(in)
		return nil
	}

	p := newProc(pid, qmpPath, r.log.With("id", id, "pid", pid))
	p.stopRequested.Store(st.StopRequested)
	if c, err := dialQMP(ctx, qmpPath, qmpDialTimeout, p.onEvent); err == nil {
		p.setClient(c)
	} else {
		r.log.Warn("adopted qemu: qmp not reachable yet; will retry", "id", id, "err", err)
	}
	in.st.State, in.st.PID = runtime.StateRunning, pid
	in.adopted = true
	in.proc = p
	if err := in.persistLocked(); err != nil {
		r.log.Error("persist state", "id", id, "err", err)
	}
	// A guest that printed its marker before the agent went away is Ready
	// now, not after the watcher's first poll: the reconciler must not see
	// it as booting again.
	if m := in.spec.Readiness.SerialMarker; m != "" && in.spec.Readiness.TCPPort == 0 {
		tail := &markerTail{path: in.path(serialLogName), off: st.SerialOffset, marker: []byte(m)}
		in.ready = tail.found()
	}
	r.put(in)
	r.watch(in, p, st.SerialOffset)
	r.log.Info("instance adopted", "id", id, "pid", pid, "ready", in.ready)
	return nil
}
