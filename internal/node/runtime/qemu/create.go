package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/node/atomicfile"

	"github.com/drover-dev/drover/internal/node/cloudinit"
	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// SecretsDir is where secrets appear in the guest, one file (0400) each.
const SecretsDir = "/run/drover/secrets"

// Create prepares spec.ID: fetches and verifies its image (and direct boot
// kernel and initrd) through the image cache, creates its qcow2 overlay and
// its cloud-init seed, and persists spec.json (without secrets) last, so a
// half-made instance is recognisable. Creating an existing id with the same
// spec (and secrets) is a no-op; with another one it is ErrExists.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	if err := r.validate(spec); err != nil {
		return runtime.Status{}, err
	}
	id := spec.ID
	unlock := r.lockID(id)
	defer unlock()

	digest := secretsDigest(r.digestKey, spec.Secrets)
	in := r.get(id)
	if _, err := os.Stat(filepath.Join(r.instDir, id)); in == nil && err == nil {
		// Not known but on disk (Recover was not called): adopt it first,
		// so a second Create never overwrites a live instance's files.
		if err := r.recoverOne(ctx, id, scanQEMU(r.instDir)); err != nil {
			return runtime.Status{}, runtime.Errorf(api.ReasonVMStartFailed, "create", id, "existing state: %w", err)
		}
		in = r.get(id)
	}
	if in != nil {
		// An instance this agent created has its secrets' digest; one it
		// recovered does not (it is never persisted): then the names must
		// match, and the values given are taken as the instance's.
		in.mu.Lock()
		same := sameSpec(in.spec, spec) && slices.Equal(in.st.SecretNames, secretNames(spec.Secrets)) &&
			(!in.digestKnown || in.digest == digest)
		in.mu.Unlock()
		if !same {
			return runtime.Status{}, &runtime.Error{Reason: api.ReasonVMStartFailed, Op: "create", ID: id, Err: runtime.ErrExists}
		}
		if err := r.resupplySeed(ctx, in, spec); err != nil { // its seed went with an earlier agent
			return runtime.Status{}, err
		}
		in.mu.Lock()
		in.digest, in.digestKnown = digest, true
		in.mu.Unlock()
		return in.status(), nil
	}

	in, err := r.prepare(ctx, spec, digest)
	if err != nil {
		return runtime.Status{}, err
	}
	r.put(in)
	r.log.Info("instance created", "id", id, "disk", in.st.Disk, "seed", in.st.Seed != "" || in.st.SeedInMemory)
	return in.status(), nil
}

// prepare makes an instance's files; on failure it removes what it made.
func (r *Runtime) prepare(ctx context.Context, spec runtime.Spec, digest string) (_ *instance, err error) {
	id := spec.ID
	dir := filepath.Join(r.instDir, id)
	if err := os.RemoveAll(dir); err != nil { // a half-made leftover: recoverOne found no spec.json
		return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "remove leftover state: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "state dir: %w", err)
	}
	in := &instance{id: id, dir: dir, st: persisted{State: runtime.StateCreated, SecretNames: secretNames(spec.Secrets)},
		digest: digest, digestKnown: true}
	specBytes, err := specJSON(spec)
	if err == nil {
		err = json.Unmarshal(specBytes, &in.spec) // a deep copy, as persisted (no secrets)
	}
	if err != nil {
		return nil, runtime.Errorf(api.ReasonVMStartFailed, "create", id, "encode spec: %w", err)
	}
	defer func() {
		if err != nil {
			in.closeSeed()
			if in.st.Overlay != "" {
				_ = os.Remove(in.st.Overlay)
			}
			r.detachVolumes(id, in.st.Volumes)
			if mv := r.opts.MicroVM; in.st.LeaseIP != "" && mv != nil && mv.Net != nil {
				// A microVM's address and tap: no Destroy will come for it.
				if err := mv.Net.Release(context.WithoutCancel(ctx), id); err != nil {
					r.log.Warn("release the network of a failed create", "id", id, "err", err)
				}
			}
			_ = os.RemoveAll(dir)
		}
	}()

	vm := spec.VMOrZero()
	switch {
	case vm.MicroVM:
		if err := r.prepareMicroVM(ctx, in, spec); err != nil {
			return nil, err
		}
		vm = runtime.VMSpec{} // its kernel, initrd and config drive are set
	case vm.BootDevice != "":
		fi, err := os.Stat(vm.BootDevice)
		if err != nil {
			return nil, runtime.Errorf(api.ReasonVolumeAttachFailed, "create", id, "boot device: %w", err)
		}
		in.st.Disk, in.st.DiskFormat, in.st.BlockDisk = vm.BootDevice, "raw", fi.Mode()&os.ModeDevice != 0
	default:
		base, err := r.fetch(ctx, "spec.image", spec.Image.Artifact())
		if err != nil {
			return nil, runtime.Errorf(api.ReasonImagePullFailed, "create", id, "%w", err)
		}
		info, err := r.inspect(ctx, base, "")
		if err != nil {
			return nil, runtime.Errorf(api.ReasonImagePullFailed, "create", id, "spec.image: %w", err)
		}
		overlay := filepath.Join(r.overlayDir, id+".qcow2")
		if err := CreateOverlay(ctx, r.opts.QEMUImg, base, info, overlay, spec.Resources.DiskGiB); err != nil {
			return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "%w", err)
		}
		in.st.Disk, in.st.DiskFormat, in.st.Overlay = overlay, "qcow2", overlay
	}
	if b := vm.Boot; b != nil {
		if in.st.Kernel, err = r.fetch(ctx, "spec.boot.kernel", b.Kernel); err != nil {
			return nil, runtime.Errorf(api.ReasonImagePullFailed, "create", id, "%w", err)
		}
		if b.Initrd != nil {
			if in.st.Initrd, err = r.fetch(ctx, "spec.boot.initrd", *b.Initrd); err != nil {
				return nil, runtime.Errorf(api.ReasonImagePullFailed, "create", id, "%w", err)
			}
		}
	}
	switch {
	case vm.CloudInit != nil && memSeeds && len(spec.Secrets) > 0:
		if in.seed, err = memSeedISO(ctx, id, seedConfig(spec)); err != nil {
			return nil, runtime.Errorf(api.ReasonSecretsInjectionFailed, "create", id, "cloud-init seed: %w", err)
		}
		in.st.SeedInMemory = true
	case vm.CloudInit != nil:
		if in.st.Seed, err = buildSeed(ctx, dir, spec); err != nil {
			reason := api.ReasonRootfsBuildFailed
			if len(spec.Secrets) > 0 {
				reason = api.ReasonSecretsInjectionFailed
			}
			return nil, runtime.Errorf(reason, "create", id, "cloud-init seed: %w", err)
		}
	case vm.SeedISO != "":
		if _, err := os.Stat(vm.SeedISO); err != nil {
			return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "seed iso: %w", err)
		}
		in.st.Seed = vm.SeedISO
	}

	if err := in.persistLocked(); err != nil {
		return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "write state: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, specFile), specBytes, 0o600); err != nil {
		return nil, runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "write spec: %w", err)
	}
	return in, nil
}

// fetch returns the verified cache path of an artifact.
func (r *Runtime) fetch(ctx context.Context, what string, a api.Artifact) (string, error) {
	res, err := r.opts.Images.Fetch(ctx, a.URL, a.SHA256)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return res.Path, nil
}

// inspect checks a cached base image (image.Inspect: qcow2 or raw, no
// backing file, no external data file), read as format ("": probed), and
// remembers the answer per blob and format: cache blobs are immutable and
// named by their digest, and running qemu-img info costs a process start
// (~4 ms here) on every Create and Start. Only accepted images are
// remembered, and only regular files are inspected (qemu-img would block
// on a FIFO).
func (r *Runtime) inspect(ctx context.Context, base, format string) (image.Info, error) {
	fi, err := os.Stat(base)
	if err != nil {
		return image.Info{}, err
	}
	if !fi.Mode().IsRegular() {
		return image.Info{}, fmt.Errorf("base image %s: not a regular file", base)
	}
	key := infoKey{path: base, format: format, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	r.infoMu.Lock()
	info, ok := r.infos[key]
	r.infoMu.Unlock()
	if ok {
		return info, nil
	}
	if info, err = image.Inspect(ctx, r.opts.QEMUImg, base, format); err != nil {
		return image.Info{}, err
	}
	r.infoMu.Lock()
	if len(r.infos) >= 256 {
		clear(r.infos)
	}
	r.infos[key] = info
	r.infoMu.Unlock()
	return info, nil
}

// infoKey identifies one version of a file, read as one format.
type infoKey struct {
	path, format string
	size, mtime  int64
}

// CreateOverlay creates a qcow2 overlay over base, sized diskGiB (0: the
// base's size). info must be image.Inspect's answer for base: the overlay
// names base's format explicitly (-F), so QEMU never probes it, and
// Inspect refused a base that names other host files.
func CreateOverlay(ctx context.Context, qemuImg, base string, info image.Info, overlay string, diskGiB int) error {
	if info.Format != image.FormatQCOW2 && info.Format != image.FormatRaw {
		return fmt.Errorf("base image %s: format %q: want image.Inspect's qcow2 or raw", base, info.Format)
	}
	if size := int64(diskGiB) << 30; diskGiB > 0 && size < info.VirtualSize {
		return fmt.Errorf("disk_gib %d is smaller than the image (%d bytes): overlays only grow", diskGiB, info.VirtualSize)
	}
	args := []string{"create", "-q", "-f", "qcow2", "-F", info.Format, "-b", base, overlay}
	if diskGiB > 0 {
		args = append(args, fmt.Sprintf("%dG", diskGiB))
	}
	_, err := runTool(ctx, qemuImg, args...)
	return err
}

// runTool runs a command and returns its stdout; the error carries stderr.
func runTool(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// buildSeed writes the NoCloud seed ISO into dir and returns its path (a
// seed with secrets is built so only where there is no memfd: memseed.go).
// The plain seed directory is removed once the ISO exists.
func buildSeed(ctx context.Context, dir string, spec runtime.Spec) (string, error) {
	cfg := seedConfig(spec)
	seedDir := filepath.Join(dir, seedDirName)
	defer func() { _ = os.RemoveAll(seedDir) }()
	if err := cloudinit.WriteSeedDir(seedDir, cfg); err != nil {
		return "", err
	}
	iso := filepath.Join(dir, seedName)
	if err := cloudinit.BuildISO(ctx, seedDir, iso); err != nil {
		return "", err
	}
	return iso, nil
}

// seedConfig is spec's cloud-init configuration; secrets become files
// under SecretsDir (0400).
func seedConfig(spec runtime.Spec) cloudinit.Config {
	ci := spec.VMOrZero().CloudInit
	cfg := cloudinit.Config{
		InstanceID:        spec.ID,
		Hostname:          ci.Hostname,
		User:              ci.User,
		SSHAuthorizedKeys: ci.SSHAuthorizedKeys,
		ReadyMarker:       spec.Readiness.SerialMarker,
	}
	names := make([]string, 0, len(spec.Secrets))
	for n := range spec.Secrets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		cfg.Files = append(cfg.Files, cloudinit.File{Path: SecretsDir + "/" + n, Content: spec.Secrets[n], Permissions: 0o400})
	}
	return cfg
}

// readSpec reads an instance's spec.json.
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

// readState reads an instance's state.json.
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
