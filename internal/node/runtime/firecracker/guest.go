package firecracker

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/drover-dev/drover/internal/node/atomicfile"
	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/oci"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// GuestOptions boot OCI images: the operator's guest kernel with the
// drover-init initramfs as its initrd (the init is not taken from the
// image: an OCI image has none that speaks Drover's config drive), the
// image's rootfs from the OCI store, and the networking layer's taps.
type GuestOptions struct {
	Kernel string // uncompressed guest kernel (vmlinux)
	Initrd string // drover-init initramfs for that kernel
	OCI    *oci.Store
	// Net is the tap provider Factory built over netsetup (also
	// Options.Taps); nil when the host has no microVM networking.
	Net *NetsetupTaps
	// SecretDir is where a config drive that holds secrets is written (a
	// 0600 file in a 0700 directory per instance). "" picks a tmpfs:
	// /run/drover-firecracker when /run is one, else
	// /dev/shm/drover-firecracker, else the instance directory (on disk;
	// logged at start).
	SecretDir string
}

// GuestBootArgs is the kernel command line of an OCI instance. drover-init
// runs from the initramfs (rdinit); panic=-1 and reboot=k make a guest
// panic or reboot end Firecracker. drover.root and drover.config name the
// disks by position: Firecracker's drives have no virtio serial Drover can
// set (their id is built from the backing file's device and inode), and
// the root drive is always vda, the next one vdb.
const GuestBootArgs = "console=ttyS0 reboot=k panic=-1 pci=off quiet rdinit=/init drover.root=/dev/vda drover.config=/dev/vdb"

// configDriveID is the config drive's Firecracker drive id.
const configDriveID = "config"

// newGuest builds the OCI store and, where the host allows it, netsetup's
// manager for Factory.
func newGuest(o runtime.Options, c Config) (*GuestOptions, error) {
	for _, p := range []string{c.Kernel, c.Initrd} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", runtime.EnvKey(Name, "KERNEL"), runtime.EnvKey(Name, "INITRD"), err)
		}
	}
	if o.Images == nil {
		return nil, errors.New("firecracker: options: images (an *image.Cache) is required")
	}
	store, err := oci.New(oci.Options{Dir: filepath.Join(o.Root, "oci"), MaxBytes: o.OCICacheMaxBytes,
		AllowLocalURLs: o.Images.AllowsLocalURLs(), Log: o.Log})
	if err != nil {
		return nil, err
	}
	g := &GuestOptions{Kernel: c.Kernel, Initrd: c.Initrd, OCI: store}
	ncfg := netsetup.Config{Bridge: o.MicroVMBridge, CIDR: o.MicroVMCIDR, StateDir: filepath.Join(o.Root, "net")}
	if err := os.MkdirAll(ncfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("firecracker: network state: %w", err)
	}
	if m, err := netsetup.New(ncfg); err != nil {
		if o.Log != nil {
			o.Log.Warn("firecracker: no microVM networking (network.mode tap and bridge are refused)", "err", err)
		}
	} else {
		g.Net = NewNetsetupTaps(m)
	}
	return g, nil
}

// netManager is what NetsetupTaps needs of *netsetup.Manager.
type netManager interface {
	Attach(ctx context.Context, id string, fwds []netsetup.Forward) (netsetup.Lease, error)
	Release(ctx context.Context, id string) error
}

// NetsetupTaps is the TapProvider over internal/node/netsetup: a tap on the
// host's bridge, an address from its CIDR (kept across restarts), NAT.
// Port forwards are not asked for (spec.ports is refused by this runtime).
type NetsetupTaps struct{ m netManager }

// NewNetsetupTaps wraps m.
func NewNetsetupTaps(m *netsetup.Manager) *NetsetupTaps { return &NetsetupTaps{m: m} }

// Tap attaches id (idempotent: a restart keeps its address and re-creates
// a missing tap).
func (n *NetsetupTaps) Tap(ctx context.Context, id string, _ runtime.VMNetwork) (Tap, error) {
	l, err := n.m.Attach(ctx, id, nil)
	if err != nil {
		return Tap{}, err
	}
	t := Tap{Dev: l.Tap, MAC: l.MAC, Gateway: l.Gateway, DNS: l.DNS}
	if l.IP.IsValid() {
		t.Guest = netip.PrefixFrom(l.IP, l.Prefix)
	}
	return t, nil
}

// Release frees id's tap, rules and address.
func (n *NetsetupTaps) Release(ctx context.Context, id, _ string) error { return n.m.Release(ctx, id) }

// guestNetwork is the config drive's network of a tap (nil: none known).
func guestNetwork(t Tap) *guestinit.Network {
	if !t.Guest.IsValid() {
		return nil
	}
	n := &guestinit.Network{Address: t.Guest.String()}
	if t.Gateway.IsValid() {
		n.Gateway = t.Gateway.String()
	}
	if len(t.DNS) > 0 {
		n.DNS = t.DNS[0].String()
	}
	return n
}

// vsockCID is an instance's guest CID: 3 and up, from a hash of its id.
// Firecracker's vsock is backed by the instance's own unix socket, so two
// guests with one CID do not collide on the host; a CID per instance keeps
// logs and guest-side tools unambiguous.
func vsockCID(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return 3 + int(h.Sum32()%(1<<30))
}

// prepareGuest is prepare for an OCI image: the image's rootfs through the
// OCI store (pulled and built once per digest), its copy at rootfs, the
// tap (so the config drive can carry the address) and the config drive.
// The id lock is held; in.dir exists.
func (r *Runtime) prepareGuest(ctx context.Context, in *instance, spec runtime.Spec, rootfs string) error {
	id, g := spec.ID, r.opts.Guest
	var auth []byte
	if n := spec.ContainerOrZero().RegistryAuth; n != "" {
		auth = spec.Secrets[n]
	}
	img, rfs, err := g.OCI.Prepare(ctx, id, spec.Image.Ref, spec.Image.Digest, auth, nil)
	if err != nil {
		return err // image_pull_failed or rootfs_build_failed already
	}
	c := img.Config
	cfg := guestinit.Workload(guestinit.Config{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, User: c.User, WorkingDir: c.WorkingDir},
		spec.Command, spec.Args, spec.Env)
	cfg.Hostname, cfg.Secrets = id, spec.Secrets
	if n := spec.VMOrZero().Network; n.Mode == api.NetworkTap || n.Mode == api.NetworkBridge {
		t, err := r.tapFor(ctx, id, n)
		if err != nil {
			return runtime.Errorf(api.ReasonNetworkSetupFailed, "create", id, "tap: %w", err)
		}
		in.st.Tap, in.st.GuestIP, in.st.MAC = t.Dev, t.guestIP(), t.MAC
		cfg.Network = guestNetwork(t)
	}
	drive, err := guestinit.EncodeConfig(cfg)
	if err != nil {
		reason := api.ReasonFirecrackerStartFailed
		if len(spec.Secrets) > 0 {
			reason = api.ReasonSecretsInjectionFailed
		}
		return runtime.Errorf(reason, "create", id, "config drive: %w", err)
	}
	if err := copyRootfs(rfs.Path, rootfs, int64(spec.Resources.DiskGiB)<<30); err != nil {
		return runtime.Errorf(api.ReasonRootfsBuildFailed, "create", id, "rootfs copy: %w", err)
	}
	dir := filepath.Dir(rootfs) // the instance dir, or the chroot when jailed
	if len(spec.Secrets) > 0 && in.st.Chroot == "" {
		// Jailed, the drive must be inside the chroot (the jailed process
		// opens nothing else): it stays there, on disk, 0600.
		sd, err := r.secretDir(id)
		if err != nil {
			return runtime.Errorf(api.ReasonSecretsInjectionFailed, "create", id, "config drive: %w", err)
		}
		if sd != "" {
			dir, in.st.ConfigTmpfs = sd, true
		}
	}
	in.st.Config = filepath.Join(dir, configName)
	if err := atomicfile.Write(in.st.Config, drive, 0o600); err != nil {
		return runtime.Errorf(api.ReasonSecretsInjectionFailed, "create", id, "config drive: %w", err)
	}
	in.st.Kernel, in.st.Initrd = g.Kernel, g.Initrd
	return nil
}

// secretDir makes the 0700 directory of id's config drive on a tmpfs; ""
// when the host has none (the drive stays in the instance directory).
func (r *Runtime) secretDir(id string) (string, error) {
	base := r.opts.Guest.SecretDir
	if base == "" {
		if base = defaultSecretDir(); base == "" {
			return "", nil
		}
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", err
	}
	d := filepath.Join(base, id)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return "", err
	}
	return d, os.Chmod(d, 0o700)
}

// defaultSecretDir is a directory of Drover's on the first tmpfs of /run
// and /dev/shm; "" when neither is one.
func defaultSecretDir() string {
	for _, d := range []string{"/run", "/dev/shm"} {
		if isTmpfs(d) {
			return filepath.Join(d, "drover-firecracker")
		}
	}
	return ""
}

// tapFor asks the TapProvider for id's tap; without one, mode tap names
// TapName(id), which must exist.
func (r *Runtime) tapFor(ctx context.Context, id string, n runtime.VMNetwork) (Tap, error) {
	if r.opts.Taps != nil {
		return r.opts.Taps.Tap(ctx, id, n)
	}
	if n.Mode == api.NetworkBridge {
		return Tap{}, errors.New("network.mode bridge: this agent has no microVM networking (see its start log)")
	}
	t := Tap{Dev: TapName(id)}
	if !tapExists(t.Dev) {
		return Tap{}, fmt.Errorf("tap %s does not exist (the networking layer creates it before start)", t.Dev)
	}
	return t, nil
}

// removeConfig removes a config drive kept outside the instance directory.
func removeConfig(st persisted) error {
	if !st.ConfigTmpfs || st.Config == "" {
		return nil
	}
	return os.RemoveAll(filepath.Dir(st.Config))
}
