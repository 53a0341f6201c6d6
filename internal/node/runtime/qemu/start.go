package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// maxSerialLog is the size past which Start rotates serial.log to
// serial.log.1.
const maxSerialLog = 8 << 20

// qmpDialTimeout bounds the greeting and capability negotiation.
const qmpDialTimeout = 10 * time.Second

// Start boots a created or stopped instance: it checks again the base
// image the instance's overlay sits on (recheckBase; an unsafe one is
// image_pull_failed naming spec.image), launches a daemonized QEMU (its
// start-up errors come back as vm_start_failed carrying QEMU's message)
// and returns once the process runs and QMP answers. Starting a running
// instance is a no-op. A host port chosen for a forward that someone else
// bound before QEMU did is chosen again (forwardTries).
func (r *Runtime) Start(ctx context.Context, id string) (runtime.Status, error) {
	unlock := r.lockID(id)
	defer unlock()
	in := r.get(id)
	if in == nil {
		return runtime.Status{}, notFound("start", id)
	}
	in.mu.Lock()
	running := in.proc != nil
	in.mu.Unlock()
	if running {
		return in.status(), nil
	}
	err := r.launch(ctx, in)
	for try := 1; try < forwardTries && errors.Is(err, errForwardTaken); try++ {
		r.log.Info("a forward's host port was taken before QEMU bound it; starting again with other ports", "id", id, "err", err)
		err = r.launch(ctx, in)
	}
	return in.status(), err
}

// errForwardTaken marks a start that failed because a host port chosen
// for a forward was bound by someone else between its choice and QEMU's
// bind: a port from the kernel's ephemeral range can be taken meanwhile
// by any outgoing connection on the host.
var errForwardTaken = errors.New("a host port chosen for a forward was taken before QEMU bound it")

// forwardTries bounds the starts of one Start call that choose the
// forwards' ports again.
const forwardTries = 3

// forwardTaken says whether QEMU's start-up message out is its refusal of
// a forward's host port that pickPorts chose (not one the spec fixed).
func forwardTaken(out string, fwds []api.PortForward) bool {
	if !strings.Contains(out, "Could not set up host forwarding rule") {
		return false
	}
	for _, f := range fwds {
		if f.HostPort == 0 {
			return true
		}
	}
	return false
}

// CommandLine returns the QEMU binary and the arguments Start would run for
// a created or stopped instance, with host ports for its forwards chosen
// now. It changes nothing (a tap device is not created).
func (r *Runtime) CommandLine(ctx context.Context, id string) (string, []string, error) {
	unlock := r.lockID(id)
	defer unlock()
	in := r.get(id)
	if in == nil {
		return "", nil, notFound("command line", id)
	}
	ports, err := r.pickPorts(in.spec.Ports)
	if err != nil {
		return "", nil, err
	}
	in.mu.Lock()
	st := in.st
	in.mu.Unlock()
	return r.opts.QEMUBinary, CommandLine(in.spec, r.launchFor(in, st, ports, tapName(in.dir))), nil
}

// accelFor is the accelerator an instance runs with.
func (r *Runtime) accelFor(spec runtime.Spec) string {
	if a := spec.VMOrZero().Accel; a != "" {
		return a
	}
	return r.opts.Accel
}

// launchFor fills a Launch from an instance's prepared files.
func (r *Runtime) launchFor(in *instance, st persisted, ports map[string]int, tap string) Launch {
	l := Launch{
		Arch:         r.arch,
		Accel:        r.accelFor(in.spec),
		Disk:         st.Disk,
		DiskFormat:   st.DiskFormat,
		BlockDisk:    st.BlockDisk,
		Seed:         st.Seed,
		SeedFD:       st.SeedInMemory,
		Kernel:       st.Kernel,
		Initrd:       st.Initrd,
		QMPSocket:    in.path(qmpSock),
		SerialSocket: in.path(serialSock),
		SerialLog:    in.path(serialLogName),
		PIDFile:      in.path(pidFileName),
		Ports:        ports,
		Daemonize:    true,
	}
	if mv := r.opts.MicroVM; mv != nil {
		l.Machine, l.TSCKHz = mv.Machine, mv.TSCKHz
	}
	l.Volumes = st.Volumes
	switch in.spec.VMOrZero().Network.Mode {
	case api.NetworkTap:
		l.Tap = tap
	case api.NetworkBridge: // netsetup's names (Attach makes them)
		l.Tap, l.MAC = netsetup.TapName(in.id), netsetup.MACFor(in.id)
	}
	return l
}

// launch starts QEMU for in; the id lock is held and no process runs.
func (r *Runtime) launch(ctx context.Context, in *instance) error {
	id, spec := in.id, in.spec
	in.mu.Lock()
	prev := in.st
	in.mu.Unlock()
	fail := func(reason api.ReasonCode, format string, args ...any) error {
		in.mu.Lock()
		in.st = prev
		if err := in.persistLocked(); err != nil {
			r.log.Error("persist state", "id", id, "err", err)
		}
		in.mu.Unlock()
		return runtime.Errorf(reason, "start", id, format, args...)
	}
	for _, f := range []struct {
		path   string
		reason api.ReasonCode
	}{{prev.Disk, api.ReasonRootfsBuildFailed}, {prev.Seed, api.ReasonRootfsBuildFailed},
		{prev.Kernel, api.ReasonImagePullFailed}, {prev.Initrd, api.ReasonImagePullFailed}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fail(f.reason, "%w", err)
		}
	}
	var seedFD *os.File // the in-memory seed, opened read-only for QEMU
	if prev.SeedInMemory {
		in.mu.Lock()
		seed := in.seed
		in.mu.Unlock()
		if seed == nil {
			return fail(api.ReasonSecretsInjectionFailed, "%w", runtime.ErrSecretsNeeded)
		}
		var err error
		if seedFD, err = reopenReadOnly(seed); err != nil {
			return fail(api.ReasonSecretsInjectionFailed, "seed: %w", err)
		}
		defer func() { _ = seedFD.Close() }()
	}
	if prev.Overlay != "" {
		// An instance made before Create inspected its base, or whose
		// cached base blob changed since, is checked again here.
		if reason, err := r.recheckBase(ctx, prev.Overlay); err != nil {
			return fail(reason, "%w", err)
		}
	}
	if err := r.claimVolumes(ctx, id, prev.Volumes); err != nil {
		return fail(api.ReasonVolumeAttachFailed, "%w", err)
	}

	ports, err := r.pickPorts(spec.Ports)
	if err != nil {
		return fail(api.ReasonNetworkSetupFailed, "%w", err)
	}
	tap := ""
	if n := spec.VMOrZero().Network; n.Mode == api.NetworkTap {
		tap = tapName(in.dir)
		if err := setupTap(ctx, tap, n.Bridge); err != nil {
			return fail(api.ReasonNetworkSetupFailed, "tap %s on bridge %s: %w", tap, n.Bridge, err)
		}
	}
	if n := spec.VMOrZero().Network; n.Mode == api.NetworkBridge {
		// The tap and this run's forwards (the lease, and so the address,
		// is the one Create took; the tap outlives a stop, Destroy
		// releases it).
		if r.opts.MicroVM == nil || r.opts.MicroVM.Net == nil {
			return fail(api.ReasonNetworkSetupFailed, "network.mode bridge: this agent has no microVM networking")
		}
		lease, err := r.opts.MicroVM.Net.Attach(ctx, id, bridgeForwards(spec.Ports, ports))
		if err != nil {
			var re *runtime.Error
			if errors.As(err, &re) {
				err = re.Err // the failing step, without netsetup's own "network <id>:" prefix
			}
			return fail(api.ReasonNetworkSetupFailed, "%w", err)
		}
		prev.LeaseIP = lease.IP.String()
	}
	for _, n := range []string{qmpSock, serialSock, pidFileName} {
		_ = os.Remove(in.path(n))
	}
	offset, err := rotateSerialLog(in.path(serialLogName))
	if err != nil {
		return fail(api.ReasonVMStartFailed, "serial log: %w", err)
	}

	next := prev
	next.State, next.PID, next.Accel = runtime.StateRunning, 0, r.accelFor(spec)
	next.StartedAt, next.ExitedAt, next.ExitReason, next.ExitDetail = r.now(), time.Time{}, "", ""
	next.Ports, next.Tap, next.SerialOffset, next.StopRequested = ports, tap, offset, false
	l := r.launchFor(in, next, ports, tap)
	args := CommandLine(spec, l)
	// Persist first: if the agent dies now, Recover finds the pid file.
	in.mu.Lock()
	in.st, in.ready, in.adopted = next, false, false
	err = in.persistLocked()
	in.mu.Unlock()
	if err != nil {
		return fail(api.ReasonVMStartFailed, "write state: %w", err)
	}

	cleanup := func() {
		pid, _ := readPidFile(l.PIDFile)
		_ = killProcess(pid, l.QMPSocket)
		waitGone(context.Background(), pid, l.QMPSocket, 10*time.Second)
		if tap != "" {
			_ = removeTap(context.Background(), tap)
		}
	}
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, r.opts.QEMUBinary, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if seedFD != nil {
		cmd.ExtraFiles = []*os.File{seedFD} // fd memSeedFD
	}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		cleanup()
		msg := strings.TrimSpace(out.String())
		if len(msg) > 4096 {
			msg = msg[:4096] + "..."
		}
		if msg == "" {
			msg = err.Error()
		}
		if forwardTaken(msg, spec.Ports) {
			return fail(api.ReasonVMStartFailed, "qemu: %s (%w)", msg, errForwardTaken)
		}
		return fail(api.ReasonVMStartFailed, "qemu: %s", msg)
	}
	pid, err := readPidFile(l.PIDFile)
	if err != nil || !processAlive(pid, l.QMPSocket) {
		cleanup()
		return fail(api.ReasonVMStartFailed, "qemu exited right after start (pid file: %v)", err)
	}
	if err := r.placeInCgroup(id, spec, pid); err != nil {
		cleanup()
		return fail(api.ReasonVMStartFailed, "cgroup: %w", err)
	}

	p := newProc(pid, l.QMPSocket, r.log.With("id", id, "pid", pid))
	c, err := dialQMP(ctx, l.QMPSocket, qmpDialTimeout, p.onEvent)
	if err != nil {
		cleanup()
		return fail(api.ReasonVMStartFailed, "%w", err)
	}
	p.setClient(c)
	in.mu.Lock()
	in.st.PID = pid
	in.proc = p
	if err := in.persistLocked(); err != nil {
		r.log.Error("persist state", "id", id, "err", err)
	}
	in.mu.Unlock()
	r.watch(in, p, offset)
	r.log.Info("instance started", "id", id, "pid", pid, "accel", next.Accel, "ports", ports, "took", time.Since(t0))
	r.emit(runtime.Event{ID: id, Kind: runtime.EventStarted, State: runtime.StateRunning})
	return nil
}

// pickPorts returns the host port of every forward, choosing a free one on
// 127.0.0.1 where HostPort is 0. (A chosen port can be taken by someone else
// before QEMU binds it; QEMU then fails to start, and Start chooses again.)
func pickPorts(fwds []api.PortForward) (map[string]int, error) {
	if len(fwds) == 0 {
		return nil, nil
	}
	ports := make(map[string]int, len(fwds))
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for _, f := range fwds {
		if f.HostPort != 0 {
			ports[forwardName(f)] = f.HostPort
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a host port for %s: %w", forwardName(f), err)
		}
		held = append(held, l)
		ports[forwardName(f)] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// tapName is the instance's tap device: "dt" and 13 hex digits of its state
// directory's hash (IFNAMSIZ allows 15).
func tapName(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "dt" + hex.EncodeToString(sum[:])[:13]
}

// rotateSerialLog moves a large serial.log aside and returns the size of the
// one QEMU will append to.
func rotateSerialLog(path string) (int64, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if fi.Size() <= maxSerialLog {
		return fi.Size(), nil
	}
	if err := os.Rename(path, path+".1"); err != nil {
		return 0, err
	}
	return 0, nil
}

// readPidFile reads QEMU's -pidfile.
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

// waitGone polls until pid is no longer this instance's live QEMU, up to d.
// It reports whether the process is gone.
func waitGone(ctx context.Context, pid int, qmpPath string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !processAlive(pid, qmpPath) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return !processAlive(pid, qmpPath)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
