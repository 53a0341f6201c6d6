package firecracker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/drover-dev/drover/internal/node/atomicfile"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pattern"
)

// ErrInvalidSpec is wrapped by every spec validation failure.
var ErrInvalidSpec = errors.New("invalid spec")

var (
	macRE    = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)
	secretRE = pattern.Must(`^[A-Za-z0-9_.-]{1,128}$`, `^[A-Za-z0-9_.-]*$`, 1, 128)
)

const maxSunPath = 107

func invalid(reason api.ReasonCode, id, format string, args ...any) *runtime.Error {
	return &runtime.Error{Reason: reason, Op: "create", ID: id, Err: fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))}
}

// validate checks what Firecracker can run; it does no I/O.
func (r *Runtime) validate(spec runtime.Spec) error {
	id, vm := spec.ID, spec.VMOrZero()
	fail := api.ReasonFirecrackerStartFailed
	if !runtime.ValidID(id) {
		return invalid(fail, id, "id %q: want 1-63 of [a-z0-9_-], starting with a letter or digit", id)
	}
	if err := r.validateImage(spec); err != nil {
		return err
	}
	switch {
	case vm.BootDevice != "":
		return invalid(api.ReasonVolumeAttachFailed, id, "spec.vm.boot_device: not supported by the firecracker runtime")
	case vm.CloudInit != nil || vm.SeedISO != "":
		return invalid(api.ReasonRootfsBuildFailed, id, "spec.vm.cloud_init: not supported by the firecracker runtime (metadata travels through MMDS)")
	case vm.Accel != "" && vm.Accel != "kvm":
		return invalid(fail, id, "spec.vm.accel %q: firecracker runs on kvm only", vm.Accel)
	case spec.Resources.VCPUs < 1 || spec.Resources.VCPUs > 32:
		return invalid(fail, id, "spec.resources.vcpus %d: firecracker takes 1-32", spec.Resources.VCPUs)
	case spec.Resources.MemoryMiB < 16:
		return invalid(fail, id, "spec.resources.memory_mib %d: want at least 16", spec.Resources.MemoryMiB)
	case spec.Resources.DiskGiB < 0:
		return invalid(api.ReasonRootfsBuildFailed, id, "spec.resources.disk_gib %d is negative", spec.Resources.DiskGiB)
	case len(spec.Volumes) > 0:
		return invalid(api.ReasonVolumeAttachFailed, id, "spec.volumes: not supported by the firecracker runtime yet")
	case len(spec.Devices.GPUs) > 0 || len(spec.Devices.PCI) > 0:
		return invalid(fail, id, "spec.devices: firecracker has no device passthrough")
	case len(spec.Ports) > 0:
		return invalid(api.ReasonNetworkSetupFailed, id, "spec.ports: not forwarded by the firecracker runtime (reach the guest at its tap address)")
	case strings.ContainsAny(spec.Readiness.SerialMarker, "\r\n"):
		return invalid(fail, id, "spec.readiness.serial_marker must be one line")
	}
	switch n := vm.Network; n.Mode {
	case "", api.NetworkUser:
		if n.MAC != "" || n.Bridge != "" {
			return invalid(api.ReasonNetworkSetupFailed, id, "spec.vm.network: mac and bridge need mode tap")
		}
		if spec.Readiness.TCPPort != 0 {
			return invalid(fail, id, "spec.readiness.tcp_port needs a tap network (the guest has no other)")
		}
	case api.NetworkTap, api.NetworkBridge:
		if n.MAC != "" && !macRE.MatchString(n.MAC) {
			return invalid(api.ReasonNetworkSetupFailed, id, "spec.vm.network.mac %q: want 6 hex pairs", n.MAC)
		}
		if n.Mode == api.NetworkBridge && r.opts.Taps == nil {
			return invalid(api.ReasonNetworkSetupFailed, id, "spec.vm.network.mode bridge: this agent has no microVM networking (see its start log)")
		}
	default:
		return invalid(api.ReasonNetworkSetupFailed, id, "spec.vm.network.mode %q: want tap or bridge (or none)", n.Mode)
	}
	if p := filepath.Join(r.instDir, id, apiSockName); len(p) > maxSunPath {
		return invalid(fail, id, "state path %s is too long for a unix socket (%d > %d bytes): use a shorter runtime dir", p, len(p), maxSunPath)
	}
	return nil
}

// validateImage checks the image and what comes with it: an OCI image
// boots the agent's kernel and drover-init (which takes command, env and
// secrets); a disk image boots the spec's kernel and its own init.
func (r *Runtime) validateImage(spec runtime.Spec) error {
	id, vm := spec.ID, spec.VMOrZero()
	fail := api.ReasonFirecrackerStartFailed
	if spec.Image.IsOCI() {
		switch {
		case r.opts.Guest == nil:
			return invalid(api.ReasonImagePullFailed, id, "spec.image.kind oci: this agent boots no OCI images on firecracker (set %s and %s)",
				runtime.EnvKey(Name, "KERNEL"), runtime.EnvKey(Name, "INITRD"))
		case spec.Image.Ref == "":
			return invalid(api.ReasonImagePullFailed, id, "spec.image.ref is required")
		case vm.Boot != nil:
			return invalid(fail, id, "spec.vm.boot: an OCI image boots the agent's kernel and drover-init, not its own")
		}
		for name := range spec.Secrets {
			if !secretRE.MatchString(name) {
				return invalid(api.ReasonSecretsInjectionFailed, id, "secret name %q: want 1-128 of [A-Za-z0-9_.-]", name)
			}
		}
		return nil
	}
	switch {
	case spec.Image.URL == "" || spec.Image.SHA256 == "":
		return invalid(api.ReasonImagePullFailed, id, "spec.image: an ext4 rootfs needs both url and sha256")
	case vm.Boot == nil || vm.Boot.Kernel.URL == "" || vm.Boot.Kernel.SHA256 == "":
		return invalid(api.ReasonImagePullFailed, id, "spec.vm.boot.kernel: firecracker boots a kernel directly (url and sha256)")
	case vm.Boot.Initrd != nil && (vm.Boot.Initrd.URL == "" || vm.Boot.Initrd.SHA256 == ""):
		return invalid(api.ReasonImagePullFailed, id, "spec.vm.boot.initrd needs both url and sha256")
	case len(spec.Command) > 0 || len(spec.Args) > 0 || len(spec.Env) > 0:
		return invalid(fail, id, "spec.command, args and env: a disk image runs its own init (use an OCI image: drover-init runs its command)")
	case len(spec.Secrets) > 0:
		return invalid(api.ReasonSecretsInjectionFailed, id, "spec.secrets: a disk image has no drover-init to receive them (use an OCI image)")
	}
	return nil
}

// specJSON is the spec as persisted and compared (no secrets).
func specJSON(spec runtime.Spec) ([]byte, error) {
	spec.Secrets = nil
	return json.Marshal(spec)
}

func sameSpec(a, b runtime.Spec) bool {
	x, err1 := specJSON(a)
	y, err2 := specJSON(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

// Create fetches and verifies the rootfs and kernel (and initrd) through the
// image cache, copies the rootfs for the instance (a reflink where the
// filesystem has them), grows it to disk_gib, and persists spec.json last.
// Creating an existing id with the same spec is a no-op; with another one
// it is ErrExists.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	if err := r.validate(spec); err != nil {
		return runtime.Status{}, err
	}
	id := spec.ID
	unlock := r.lockID(id)
	defer unlock()
	in := r.get(id)
	if _, err := os.Stat(filepath.Join(r.instDir, id)); in == nil && err == nil {
		if err := r.recoverOne(ctx, id, scanProcs(r.instDir)); err != nil {
			return runtime.Status{}, runtime.Errorf(api.ReasonFirecrackerStartFailed, "create", id, "existing state: %w", err)
		}
		in = r.get(id)
	}
	if in != nil {
		if !sameSpec(in.spec, spec) {
			return runtime.Status{}, &runtime.Error{Reason: api.ReasonFirecrackerStartFailed, Op: "create", ID: id, Err: runtime.ErrExists}
		}
		return in.status(), nil
	}
	in, err := r.prepare(ctx, spec)
	if err != nil {
		return runtime.Status{}, err
	}
	r.put(in)
	r.log.Info("instance created", "id", id, "rootfs", in.st.Rootfs)
	return in.status(), nil
}

func (r *Runtime) prepare(ctx context.Context, spec runtime.Spec) (_ *instance, err error) {
	id := spec.ID
	dir := filepath.Join(r.instDir, id)
	if err := os.RemoveAll(dir); err != nil {
		return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "remove leftover state: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "state dir: %w", err)
	}
	in := &instance{id: id, dir: dir, st: persisted{State: runtime.StateCreated}}
	b, err := specJSON(spec)
	if err == nil {
		err = json.Unmarshal(b, &in.spec)
	}
	if err != nil {
		return nil, runtime.Errorf(api.ReasonFirecrackerStartFailed, "create", id, "encode spec: %w", err)
	}
	defer func() {
		if err != nil {
			r.undoPrepare(context.WithoutCancel(ctx), in)
		}
	}()
	rootDir := dir
	if j := r.opts.Jailer; j != nil {
		// Jailed, the rootfs lives in the chroot from the start: the jailed
		// process sees only what is under it.
		in.st.JailID = jailID(id)
		in.st.Chroot = filepath.Join(j.ChrootBase, filepath.Base(r.opts.Binary), in.st.JailID, "root")
		_ = os.RemoveAll(filepath.Dir(in.st.Chroot))
		if err := os.MkdirAll(in.st.Chroot, 0o750); err != nil {
			return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "chroot: %w", err)
		}
		rootDir = in.st.Chroot
	}
	in.st.Rootfs = filepath.Join(rootDir, rootfsName)
	if spec.Image.IsOCI() {
		err = r.prepareGuest(ctx, in, spec, in.st.Rootfs)
	} else {
		err = r.prepareDisk(ctx, in, spec)
	}
	if err != nil {
		return nil, err
	}
	if err := in.persistLocked(); err != nil {
		return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "write state: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, specFile), b, 0o600); err != nil {
		return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "write spec: %w", err)
	}
	return in, nil
}

// prepareDisk is prepare for a disk image: the rootfs, kernel and initrd
// through the image cache, the rootfs copied to in.st.Rootfs.
func (r *Runtime) prepareDisk(ctx context.Context, in *instance, spec runtime.Spec) error {
	id := spec.ID
	fetch := func(what string, a api.Artifact) (string, error) {
		res, err := r.opts.Images.Fetch(ctx, a.URL, a.SHA256)
		if err != nil {
			return "", runtime.Errorf(api.ReasonImagePullFailed, "create", id, "%s: %w", what, err)
		}
		return res.Path, nil
	}
	base, err := fetch("spec.image", spec.Image.Artifact())
	if err != nil {
		return err
	}
	boot := spec.VMOrZero().Boot
	if in.st.Kernel, err = fetch("spec.vm.boot.kernel", boot.Kernel); err != nil {
		return err
	}
	if boot.Initrd != nil {
		if in.st.Initrd, err = fetch("spec.vm.boot.initrd", *boot.Initrd); err != nil {
			return err
		}
	}
	if err := copyRootfs(base, in.st.Rootfs, int64(spec.Resources.DiskGiB)<<30); err != nil {
		return runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "rootfs copy: %w", err)
	}
	return nil
}

// undoPrepare removes what a failed prepare made: the state dir, chroot,
// a config drive on a tmpfs, the tap and the OCI image's lease.
func (r *Runtime) undoPrepare(ctx context.Context, in *instance) {
	_ = os.RemoveAll(in.dir)
	if in.st.Chroot != "" {
		_ = os.RemoveAll(filepath.Dir(in.st.Chroot))
	}
	_ = removeConfig(in.st)
	if in.st.Tap != "" && r.opts.Taps != nil {
		if err := r.opts.Taps.Release(ctx, in.id, in.st.Tap); err != nil {
			r.log.Warn("release tap", "id", in.id, "tap", in.st.Tap, "err", err)
		}
	}
	if g := r.opts.Guest; g != nil && g.OCI != nil {
		_ = g.OCI.Release(in.id)
	}
}

// copyRootfs copies base to dst (a reflink clone where the filesystem can,
// else a plain copy), then grows it to size bytes when size is larger (the
// ext4 inside is not resized: the guest may resize2fs).
func copyRootfs(base, dst string, size int64) error {
	src, err := os.Open(base)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", base)
	}
	if size > 0 && size < fi.Size() {
		return fmt.Errorf("disk_gib (%d bytes) is smaller than the rootfs image (%d bytes)", size, fi.Size())
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if !cloneFile(out, src) {
		if err := sparseCopy(out, src); err != nil {
			_ = out.Close()
			return err
		}
	}
	if err := out.Truncate(max(size, fi.Size())); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// sparseCopy copies src to dst, seeking over all-zero blocks so the copy of
// a sparse ext4 image stays sparse (the caller truncates dst to its size).
func sparseCopy(dst, src *os.File) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := io.ReadFull(src, buf)
		if n > 0 {
			if allZero(buf[:n]) {
				if _, serr := dst.Seek(int64(n), io.SeekCurrent); serr != nil {
					return serr
				}
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// jailID is the jailer's --id for an instance: the jailer takes
// [a-zA-Z0-9-]{1,64}, so an id with underscores gets them replaced and a
// hash suffix (no two ids share a jail).
func jailID(id string) string {
	if !strings.Contains(id, "_") {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return strings.ReplaceAll(id, "_", "-") + "-" + hex.EncodeToString(sum[:])[:8]
}

// TapName is the tap device a tap-mode instance uses when no TapProvider
// is configured: "fc" and 13 hex digits of the id's hash (IFNAMSIZ 15).
func TapName(id string) string {
	sum := sha256.Sum256([]byte("firecracker/" + id))
	return "fc" + hex.EncodeToString(sum[:])[:13]
}

func readSpec(dir string) (runtime.Spec, error) {
	var spec runtime.Spec
	b, err := os.ReadFile(filepath.Join(dir, specFile))
	if err != nil {
		return spec, err
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return spec, fmt.Errorf("%s: %w", specFile, err)
	}
	return spec, nil
}

func readState(dir string) (persisted, error) {
	var st persisted
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return persisted{State: runtime.StateCreated}, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", stateFile, err)
	}
	return st, nil
}
