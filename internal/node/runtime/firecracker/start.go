package firecracker

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// DefaultBootArgs is the kernel command line when spec.vm.boot.cmdline is
// empty (Firecracker's own getting-started line; root= comes from the root
// drive).
const DefaultBootArgs = "console=ttyS0 reboot=k panic=1 pci=off"

// Interface and drive ids.
const (
	rootDriveID = "rootfs"
	ifaceID     = "eth0"
)

// Start boots a created or stopped instance: it spawns firecracker (or the
// jailer), configures the machine through the API (machine config, boot
// source, root drive, config drive, tap interface with MMDS V2 metadata,
// vsock) and sends InstanceStart. It returns once the guest runs. Any
// failure stops the process and is firecracker_start_failed naming the
// step, Firecracker's fault_message and the tail of its log (the serial
// log: firecracker's own output and the guest console). Starting a running
// instance is a no-op.
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
	return in.status(), err
}

// guestPath is the path Firecracker is given for a host file: itself, or
// relative to the chroot when jailed.
func guestPath(st persisted, host string) string {
	if st.Chroot == "" || host == "" {
		return host
	}
	return "/" + strings.TrimPrefix(strings.TrimPrefix(host, st.Chroot), "/")
}

// launch starts the instance's process; the id lock is held and none runs.
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
	}{{prev.Rootfs, api.ReasonRootfsBuildFailed}, {prev.Kernel, api.ReasonImagePullFailed}, {prev.Initrd, api.ReasonImagePullFailed},
		{prev.Config, api.ReasonSecretsInjectionFailed}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fail(f.reason, "%w", err)
		}
	}
	next := prev
	next.State, next.PID, next.StartedAt = runtime.StateRunning, 0, r.now()
	next.ExitedAt, next.ExitReason, next.ExitDetail, next.StopRequested = time.Time{}, "", "", false
	next.Tap, next.GuestIP, next.MAC = "", "", ""
	if n := spec.VMOrZero().Network; n.Mode == api.NetworkTap || n.Mode == api.NetworkBridge {
		t, err := r.tapFor(ctx, id, n)
		if err != nil {
			return fail(api.ReasonNetworkSetupFailed, "tap: %w", err)
		}
		if prev.Config != "" && prev.GuestIP != t.guestIP() {
			// The config drive carries the address it was made with.
			return fail(api.ReasonNetworkSetupFailed, "tap: the guest's address changed from %s to %s since create", prev.GuestIP, t.guestIP())
		}
		next.Tap, next.GuestIP, next.MAC = t.Dev, t.guestIP(), t.MAC
	}
	kernel, initrd := prev.Kernel, prev.Initrd
	if prev.Chroot != "" {
		var err error
		if kernel, initrd, err = r.fillChroot(prev); err != nil {
			return fail(api.ReasonFirecrackerStartFailed, "jailer chroot: %w", err)
		}
	}
	sock := in.apiSocket(prev)
	for _, p := range []string{sock, in.path(vsockName), in.path(pidFileName)} {
		_ = os.Remove(p)
	}
	logf, err := os.OpenFile(in.path(serialLogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fail(api.ReasonFirecrackerStartFailed, "serial log: %w", err)
	}
	defer func() { _ = logf.Close() }()
	if fi, err := logf.Stat(); err == nil {
		next.SerialOffset = fi.Size()
	}
	in.mu.Lock()
	in.st, in.ready, in.adopted = next, false, false
	err = in.persistLocked()
	in.mu.Unlock()
	if err != nil {
		return fail(api.ReasonFirecrackerStartFailed, "write state: %w", err)
	}

	name, args, key := r.commandLine(in, prev)
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = logf, logf, in.dir
	detachAttrs(cmd)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return fail(api.ReasonFirecrackerStartFailed, "spawn %s: %w", name, err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	pid := cmd.Process.Pid
	_ = os.WriteFile(in.path(pidFileName), []byte(strconv.Itoa(pid)+"\n"), 0o600)
	c := NewClient(sock, 10*time.Second)
	stopAndFail := func(step string, err error) error {
		_ = killProcess(pid, key)
		select {
		case <-waited:
		case <-time.After(killWait):
		}
		_ = os.Remove(in.path(pidFileName))
		if tail := logTail(in.path(serialLogName), next.SerialOffset, 2048); tail != "" {
			return fail(api.ReasonFirecrackerStartFailed, "%s: %v (firecracker log: %s)", step, err, tail)
		}
		return fail(api.ReasonFirecrackerStartFailed, "%s: %v", step, err)
	}
	if err := waitAPI(ctx, c, waited, r.opts.StartTimeout); err != nil {
		return stopAndFail("api socket", err)
	}
	if err := r.configure(ctx, c, in, next, kernel, initrd); err != nil {
		return stopAndFail("configure", err)
	}
	if err := c.Action(ctx, ActionInstanceStart); err != nil {
		return stopAndFail("InstanceStart", err)
	}
	p := newProc(pid, key, c, waited)
	in.mu.Lock()
	in.st.PID, in.proc = pid, p
	if err := in.persistLocked(); err != nil {
		r.log.Error("persist state", "id", id, "err", err)
	}
	in.mu.Unlock()
	r.watch(in, p)
	r.log.Info("instance started", "id", id, "pid", pid, "jailed", prev.Chroot != "", "took", time.Since(t0))
	r.emit(runtime.Event{ID: id, Kind: runtime.EventStarted, State: runtime.StateRunning})
	return nil
}

// commandLine is the process to spawn: firecracker --api-sock <sock>, or the
// jailer around it; key finds it again in /proc.
func (r *Runtime) commandLine(in *instance, st persisted) (string, []string, procKey) {
	if j := r.opts.Jailer; j != nil && st.Chroot != "" {
		return j.Binary, jailerArgs(*j, r.opts.Binary, st.JailID), procKey{"--id", st.JailID}
	}
	sock := in.apiSocket(st)
	return r.opts.Binary, []string{"--api-sock", sock}, procKey{"--api-sock", sock}
}

// jailerArgs runs firecracker chrooted in ChrootBase/<exec name>/<jail id>/root
// as uid:gid; its API socket is /run/firecracker.socket in the chroot.
func jailerArgs(j JailerConfig, binary, jid string) []string {
	return []string{"--id", jid, "--exec-file", binary, "--uid", strconv.Itoa(j.UID), "--gid", strconv.Itoa(j.GID),
		"--chroot-base-dir", j.ChrootBase, "--", "--api-sock", "/run/firecracker.socket"}
}

// configure sends the pre-boot configuration, in Firecracker's order.
func (r *Runtime) configure(ctx context.Context, c *Client, in *instance, st persisted, kernel, initrd string) error {
	spec, vm := in.spec, in.spec.VMOrZero()
	step := func(name string, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	if err := step("machine-config", c.PutMachineConfig(ctx, MachineConfiguration{VCPUCount: spec.Resources.VCPUs, MemSizeMiB: spec.Resources.MemoryMiB})); err != nil {
		return err
	}
	bootArgs := GuestBootArgs
	if vm.Boot != nil {
		if bootArgs = vm.Boot.Cmdline; bootArgs == "" {
			bootArgs = DefaultBootArgs
		}
	}
	if err := step("boot-source", c.PutBootSource(ctx, BootSource{KernelImagePath: guestPath(st, kernel), InitrdPath: guestPath(st, initrd), BootArgs: bootArgs})); err != nil {
		return err
	}
	if err := step("drives/"+rootDriveID, c.PutDrive(ctx, Drive{DriveID: rootDriveID, IsRootDevice: true, IsReadOnly: false,
		PathOnHost: guestPath(st, st.Rootfs), CacheType: "Unsafe", IOEngine: "Sync"})); err != nil {
		return err
	}
	if st.Config != "" {
		// The guestinit config drive: the second drive, vdb to drover-init.
		if err := step("drives/"+configDriveID, c.PutDrive(ctx, Drive{DriveID: configDriveID, IsRootDevice: false, IsReadOnly: true,
			PathOnHost: guestPath(st, st.Config), CacheType: "Unsafe", IOEngine: "Sync"})); err != nil {
			return err
		}
	}
	if st.Tap != "" {
		mac := vm.Network.MAC
		if mac == "" {
			mac = st.MAC
		}
		if err := step("network-interfaces/"+ifaceID, c.PutNetworkInterface(ctx, NetworkInterface{IfaceID: ifaceID, HostDevName: st.Tap, GuestMAC: mac})); err != nil {
			return err
		}
		if err := step("mmds/config", c.PutMMDSConfig(ctx, MMDSConfig{Version: "V2", NetworkInterfaces: []string{ifaceID}})); err != nil {
			return err
		}
		if err := step("mmds", c.PutMMDS(ctx, metadata(spec, st))); err != nil {
			return err
		}
	}
	vsock := in.path(vsockName)
	if st.Chroot != "" {
		vsock = "/" + vsockName
	}
	return step("vsock", c.PutVsock(ctx, Vsock{GuestCID: vsockCID(in.id), UDSPath: vsock}))
}

// metadata is the MMDS contents: what the guest may read about itself at
// 169.254.169.254 (MMDS V2: a session token first). No secrets, no
// environment, no command: those travel on the config drive only (MMDS is
// readable by any process in the guest).
func metadata(spec runtime.Spec, st persisted) map[string]any {
	host := spec.ID
	if ci := spec.VMOrZero().CloudInit; ci != nil && ci.Hostname != "" {
		host = ci.Hostname
	}
	m := map[string]any{"instance_id": spec.ID, "hostname": host}
	if spec.Owner != "" {
		m["owner"] = spec.Owner
	}
	if st.GuestIP != "" {
		m["local_ipv4"] = st.GuestIP
	}
	return map[string]any{"drover": m}
}

// fillChroot links (or copies) the kernel and initrd into the chroot and
// gives the jailed uid:gid what it must open; it returns their host paths.
func (r *Runtime) fillChroot(st persisted) (kernel, initrd string, err error) {
	j := r.opts.Jailer
	place := func(src, name string) (string, error) {
		if src == "" {
			return "", nil
		}
		dst := filepath.Join(st.Chroot, name)
		_ = os.Remove(dst)
		if err := os.Link(src, dst); err != nil {
			if err := copyRootfs(src, dst, 0); err != nil {
				return "", err
			}
		}
		return dst, nil
	}
	if kernel, err = place(st.Kernel, kernelName); err != nil {
		return "", "", err
	}
	if initrd, err = place(st.Initrd, initrdName); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(filepath.Join(st.Chroot, "run"), 0o750); err != nil {
		return "", "", err
	}
	for _, p := range []string{st.Chroot, filepath.Join(st.Chroot, "run"), st.Rootfs, st.Config} {
		if p == "" {
			continue
		}
		if err := os.Lchown(p, j.UID, j.GID); err != nil {
			return "", "", err
		}
	}
	return kernel, initrd, nil
}

// waitAPI polls GET / until the API answers, the process exits or d passes.
func waitAPI(ctx context.Context, c *Client, waited chan error, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Describe(qctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer within %v: %w", d, err)
		}
		select {
		case werr := <-waited:
			waited <- werr // for whoever waits next (the failed start's cleanup)
			return fmt.Errorf("firecracker exited before its API answered (%v)", werr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// logTail is the last n bytes of the log written after off, one line.
func logTail(path string, off int64, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	start := max(off, fi.Size()-n)
	if start >= fi.Size() {
		return ""
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, start, fi.Size()-start))
	return strings.Join(strings.Fields(string(b)), " ")
}
