package firecracker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Recover re-adopts the instances under Root after an agent restart. A
// process is adopted when its pid file names a live process whose command
// line has the instance's --api-sock (or jail --id) and its API answers
// GET /; watching resumes, Status.Adopted is set and nothing is started
// again. A live process whose API does not answer is killed and the
// instance is crashed; one that died unwatched is stopped (a stop had been
// asked) or crashed. Half-created instances (no spec.json) are removed;
// duplicates, and firecrackers whose instance directory is gone, are killed.
func (r *Runtime) Recover(ctx context.Context) ([]runtime.Status, error) {
	entries, err := os.ReadDir(r.instDir)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	procs := scanProcs(r.instDir)
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !runtime.ValidID(e.Name()) {
			continue
		}
		unlock := r.lockID(e.Name())
		err := r.recoverOne(ctx, e.Name(), procs)
		unlock()
		if err != nil {
			r.log.Error("recover instance", "id", e.Name(), "err", err)
			errs = append(errs, err)
		}
	}
	for k, pids := range procs {
		if k.flag != "--api-sock" {
			continue // jailed ones are found by their instance's jail id only
		}
		if _, err := os.Stat(filepath.Dir(k.value)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		for _, pid := range pids {
			r.log.Warn("killing a firecracker whose instance directory is gone", "pid", pid, "api_sock", k.value)
			if err := killProcess(pid, k); err != nil {
				errs = append(errs, fmt.Errorf("recover: kill orphan %d: %w", pid, err))
			}
		}
	}
	list, _ := r.List(ctx)
	return list, errors.Join(errs...)
}

// recoverOne loads id from disk unless known; the id lock is held.
func (r *Runtime) recoverOne(ctx context.Context, id string, procs map[procKey][]int) error {
	if r.get(id) != nil {
		return nil
	}
	dir := filepath.Join(r.instDir, id)
	spec, err := readSpec(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return nil
		}
		r.log.Warn("removing a half-created instance", "id", id)
		k := procKey{"--api-sock", filepath.Join(dir, apiSockName)}
		for _, pid := range procs[k] {
			_ = killProcess(pid, k)
		}
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
	_, _, key := r.commandLine(in, st)
	if st.Chroot != "" {
		key = procKey{"--id", st.JailID}
	}
	candidates := procs[key]
	if pid, err := readPidFile(in.path(pidFileName)); err == nil {
		candidates = append([]int{pid}, candidates...)
	}
	pid := 0
	for _, c := range candidates {
		if processAlive(c, key) {
			pid = c
			break
		}
	}
	for _, c := range candidates {
		if c != pid && processAlive(c, key) {
			r.log.Warn("killing a duplicate firecracker", "id", id, "pid", c, "adopted", pid)
			_ = killProcess(c, key)
		}
	}
	client := NewClient(in.apiSocket(st), 10*time.Second)
	var info InstanceInfo
	if pid != 0 {
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		info, err = client.Describe(qctx)
		cancel()
		if err != nil {
			r.log.Warn("killing a firecracker whose API does not answer", "id", id, "pid", pid, "err", err)
			_ = killProcess(pid, key)
			waitGone(pid, key, killWait)
			st.StopRequested = false
			st.ExitDetail = "firecracker did not answer its API after an agent restart: " + err.Error()
			in.st = st
			pid = 0
		}
	}
	if pid == 0 {
		if in.st.State == runtime.StateRunning {
			in.st.State = runtime.StateCrashed
			if in.st.ExitDetail == "" {
				in.st.ExitDetail = "firecracker exited while the agent was not watching"
			}
			if in.st.StopRequested {
				in.st.State, in.st.ExitDetail = runtime.StateStopped, "stopped on request (while the agent was not watching)"
			}
			in.st.PID, in.st.ExitedAt, in.st.StopRequested = 0, r.now(), false
			_ = os.Remove(in.path(pidFileName))
			if err := in.persistLocked(); err != nil {
				return err
			}
		}
		r.put(in)
		return nil
	}
	p := newProc(pid, key, client, nil)
	p.stopRequested.Store(st.StopRequested)
	in.st.State, in.st.PID = runtime.StateRunning, pid
	in.adopted, in.proc = true, p
	if err := in.persistLocked(); err != nil {
		r.log.Error("persist state", "id", id, "err", err)
	}
	rd := in.spec.Readiness
	switch {
	case rd.SerialMarker != "" && rd.TCPPort == 0:
		in.ready = (&markerTail{path: in.path(serialLogName), off: st.SerialOffset, marker: []byte(rd.SerialMarker)}).found()
	case rd.SerialMarker == "" && rd.TCPPort == 0:
		in.ready = info.State == StateRunning
	}
	r.put(in)
	r.watch(in, p)
	r.log.Info("instance adopted", "id", id, "pid", pid, "ready", in.ready, "vmm", info.VMMVersion)
	return nil
}
