// Package firecracker is the Firecracker adapter of runtime.Runtime: a
// microVM per instance, one firecracker process (optionally started by the
// jailer) configured over its REST API on a unix socket (client.go, a
// small client written against the API's specification, checked request
// by request by the contract test) and started with InstanceStart.
//
// An instance is one of two kinds. A disk image (Spec.Image kind disk: an
// ext4 rootfs by URL and SHA256 through the image cache) is copied per
// instance and booted with the kernel of Spec.VM.Boot (and its initrd and
// command line); the guest brings its own init. An OCI image (kind oci,
// guest.go) needs the operator's guest kernel and drover-init initramfs
// (Options.Guest): internal/node/oci builds the image's ext4 rootfs once
// per digest, the instance gets a sparse or reflink copy of it, and
// drover-init, booted as the initrd, reads a second, read-only drive (the
// guestinit config drive: entrypoint, env, secrets, the guest's address)
// and runs the image's entrypoint. State lives in Root/instances/<id>/
// (spec.json without secrets, state.json, api.sock, v.sock, serial.log,
// firecracker.pid, rootfs.ext4, config.img unless it holds secrets: then
// it lives on a tmpfs, see configDriveDir). Processes outlive the agent;
// Recover re-adopts them by pid file, /proc command line and an API that
// answers GET /.
//
// It must not create tap devices (the networking layer does: TapProvider,
// NetsetupTaps over internal/node/netsetup), nor probe KVM itself (the
// agent's accelerator verdict says whether KVM works:
// runtime.Options.Accel).
package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"
	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Name is the adapter's registry name (NODE_AGENT_RUNTIME=firecracker), and
// what the agent's capabilities list when it runs.
const Name = "firecracker"

var _ runtime.Releaser = (*Runtime)(nil)

// Config is the runtime's own configuration: its NODE_AGENT_FIRECRACKER_*
// settings.
type Config struct {
	Binary    string // NODE_AGENT_FIRECRACKER_BINARY
	Jailer    string // NODE_AGENT_FIRECRACKER_JAILER: the jailer binary; "" runs firecracker directly
	JailerUID int    // NODE_AGENT_FIRECRACKER_JAILER_UID
	JailerGID int    // NODE_AGENT_FIRECRACKER_JAILER_GID
	// Kernel and Initrd boot OCI images: a guest kernel (an uncompressed
	// vmlinux, as Firecracker loads) and the drover-init initramfs built
	// for it (`drover-init initramfs`). Both or neither; neither refuses
	// OCI images.
	Kernel string // NODE_AGENT_FIRECRACKER_KERNEL
	Initrd string // NODE_AGENT_FIRECRACKER_INITRD
}

// Settings are the keys the Firecracker runtime owns.
func Settings() []runtime.Setting {
	return []runtime.Setting{
		{Name: "BINARY", Usage: "firecracker binary (a name on PATH or a path)", Default: "firecracker"},
		{Name: "JAILER", Usage: "jailer binary: when set, firecracker runs chrooted under it as JAILER_UID:JAILER_GID (production)"},
		{Name: "JAILER_UID", Usage: "uid the jailer drops to (with JAILER)", Default: "0"},
		{Name: "JAILER_GID", Usage: "gid the jailer drops to (with JAILER)", Default: "0"},
		{Name: "KERNEL", Usage: "guest kernel (vmlinux) that boots OCI images; empty: OCI images are refused"},
		{Name: "INITRD", Usage: "drover-init initramfs for KERNEL (drover-init initramfs)"},
	}
}

// ParseConfig builds the Config, naming the key of a bad value.
func ParseConfig(v runtime.Values) (Config, error) {
	c := Config{Binary: v["BINARY"], Jailer: v["JAILER"], Kernel: v["KERNEL"], Initrd: v["INITRD"]}
	if (c.Kernel == "") != (c.Initrd == "") {
		return c, fmt.Errorf("%s and %s go together", runtime.EnvKey(Name, "KERNEL"), runtime.EnvKey(Name, "INITRD"))
	}
	for _, f := range []struct {
		key string
		dst *int
	}{{"JAILER_UID", &c.JailerUID}, {"JAILER_GID", &c.JailerGID}} {
		n, err := strconv.Atoi(v[f.key])
		if err != nil || n < 0 {
			return c, fmt.Errorf("%s %q: want a non-negative integer", runtime.EnvKey(Name, f.key), v[f.key])
		}
		*f.dst = n
	}
	return c, nil
}

// Entry is the registration: runtime.Registry{firecracker.Name: firecracker.Entry()}.
func Entry() runtime.Entry { return runtime.WithConfig(ParseConfig, Factory, Settings()...) }

// Detect says whether this host can run Firecracker: a firecracker binary
// (on PATH or at binary) and a KVM the agent proved (accel is the agent's
// verdict, runtime.Options.Accel). It returns the binary's path, or why not.
func Detect(binary, accel string) (string, error) {
	if !supportedOS {
		return "", errUnsupportedOS
	}
	if binary == "" {
		binary = "firecracker"
	}
	path, err := exec.LookPath(binary)
	if err != nil {
		return "", fmt.Errorf("no firecracker binary (%s: %v; set %s)", binary, err, runtime.EnvKey(Name, "BINARY"))
	}
	if accel != "kvm" {
		return "", fmt.Errorf("firecracker needs a working KVM; the agent's accelerator is %q (see docs/runbooks/accelerators.md)", accel)
	}
	return path, nil
}

// Factory builds the runtime when Detect passes; otherwise it refuses, so the
// agent does not offer "firecracker" in its capabilities.
func Factory(ctx context.Context, o runtime.Options, c Config) (runtime.Runtime, error) {
	bin, err := Detect(c.Binary, o.Accel)
	if err != nil {
		return nil, err
	}
	opts := Options{Root: o.Root, Images: o.Images, Binary: bin, Log: o.Log}
	if c.Jailer != "" {
		jp, err := exec.LookPath(c.Jailer)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", runtime.EnvKey(Name, "JAILER"), c.Jailer, err)
		}
		opts.Jailer = &JailerConfig{Binary: jp, UID: c.JailerUID, GID: c.JailerGID}
	}
	if c.Kernel != "" {
		g, err := newGuest(o, c)
		if err != nil {
			return nil, err
		}
		opts.Guest = g
		if g.Net != nil {
			opts.Taps = g.Net
		}
	}
	return New(ctx, opts)
}

// TapProvider hands out the host tap device of an instance's network
// interface (the networking layer creates and deletes taps; this adapter
// only names one to Firecracker). In the agent it is NetsetupTaps.
type TapProvider interface {
	// Tap returns the tap of id, made if missing; asked again for the same
	// id (a restart) it gives the same device and address.
	Tap(ctx context.Context, id string, n runtime.VMNetwork) (Tap, error)
	// Release is called when the instance goes for good (Destroy).
	Release(ctx context.Context, id, dev string) error
}

// Tap is an instance's network interface as the networking layer made it.
type Tap struct {
	Dev string // host tap device
	MAC string // the guest NIC's MAC ("": Firecracker picks one)
	// Guest is the guest's address and prefix (invalid when unknown: a
	// readiness TCP port then cannot be checked, and drover-init leaves
	// eth0 down); Gateway and DNS go with it.
	Guest   netip.Prefix
	Gateway netip.Addr
	DNS     []netip.Addr
}

// guestIP is the guest's address as a string ("" when unknown).
func (t Tap) guestIP() string {
	if !t.Guest.IsValid() {
		return ""
	}
	return t.Guest.Addr().String()
}

// JailerConfig runs firecracker under the jailer.
type JailerConfig struct {
	Binary     string
	UID, GID   int
	ChrootBase string // default Root/jail
}

// Options configures a Runtime.
type Options struct {
	// Root holds Root/instances/<id>/; keep it short (unix socket paths).
	Root   string
	Images *image.Cache
	// Binary is the firecracker binary (default "firecracker").
	Binary string
	Jailer *JailerConfig
	// Taps names tap devices; nil: a spec in tap mode uses the tap named
	// TapName(id), which must exist when it starts, and mode bridge is
	// refused.
	Taps TapProvider
	// Guest boots OCI images with drover-init; nil refuses them.
	Guest *GuestOptions
	// StartTimeout bounds the wait for the API socket (default 10s).
	StartTimeout time.Duration
	Log          *slog.Logger
	Now          func() time.Time
}

// File names inside an instance directory (and, jailed, its chroot).
const (
	specFile      = "spec.json"
	stateFile     = "state.json"
	pidFileName   = "firecracker.pid"
	serialLogName = "serial.log"
	apiSockName   = "api.sock"
	vsockName     = "v.sock"
	rootfsName    = "rootfs.ext4"
	kernelName    = "vmlinux"
	initrdName    = "initrd"
	configName    = "config.img"
)

var errUnsupportedOS = errors.New("firecracker: the Firecracker runtime needs Linux")

// Runtime is the Firecracker runtime; its methods are safe for concurrent
// use and calls on one id are serialised.
type Runtime struct {
	opts    Options
	instDir string
	log     *slog.Logger
	now     func() time.Time

	locksMu sync.Mutex
	locks   map[string]*sync.Mutex

	mu    sync.Mutex
	insts map[string]*instance

	subMu sync.Mutex
	subs  map[chan runtime.Event]struct{}

	wg sync.WaitGroup
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks opts and creates the state directories.
func New(_ context.Context, opts Options) (*Runtime, error) {
	if !supportedOS {
		return nil, errUnsupportedOS
	}
	if opts.Root == "" {
		return nil, errors.New("firecracker: options: root is required")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("firecracker: options: root: %w", err)
	}
	opts.Root = root
	if opts.Images == nil {
		return nil, errors.New("firecracker: options: images (an *image.Cache) is required")
	}
	if opts.Binary == "" {
		opts.Binary = "firecracker"
	}
	if j := opts.Jailer; j != nil && j.ChrootBase == "" {
		j.ChrootBase = filepath.Join(root, "jail")
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 10 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Runtime{opts: opts, instDir: filepath.Join(root, "instances"), log: opts.Log.With("runtime", Name),
		now: opts.Now, locks: map[string]*sync.Mutex{}, insts: map[string]*instance{}, subs: map[chan runtime.Event]struct{}{}}
	if err := os.MkdirAll(r.instDir, 0o700); err != nil {
		return nil, fmt.Errorf("firecracker: state dir: %w", err)
	}
	return r, nil
}

// Name is "firecracker".
func (r *Runtime) Name() string { return Name }

// Names are "firecracker" and, when it boots OCI images with drover-init
// (Guest set: NODE_AGENT_FIRECRACKER_KERNEL and _INITRD), "microvm": the
// control plane places instances with runtime microvm on hosts offering
// it, and this runtime runs them (in network mode tap or bridge; it has
// no user networking or host port forwards).
func (r *Runtime) Names() []string {
	if r.opts.Guest == nil {
		return []string{Name}
	}
	return []string{Name, api.RuntimeMicroVM}
}

// Close lets go of every instance without stopping it (an agent that
// exits); a Recover over the same Root adopts them again.
func (r *Runtime) Close() error {
	r.mu.Lock()
	insts := r.insts
	r.insts = map[string]*instance{}
	r.mu.Unlock()
	for _, in := range insts {
		in.mu.Lock()
		if p := in.proc; p != nil {
			p.detach()
		}
		in.mu.Unlock()
	}
	r.wg.Wait()
	return nil
}

// lockID serialises the operations on one id (locks are kept: ids are few).
func (r *Runtime) lockID(id string) func() {
	r.locksMu.Lock()
	l := r.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		r.locks[id] = l
	}
	r.locksMu.Unlock()
	l.Lock()
	return l.Unlock
}

// persisted is state.json; it never holds secrets.
type persisted struct {
	State         runtime.State  `json:"state"`
	PID           int            `json:"pid,omitempty"`
	StartedAt     time.Time      `json:"started_at,omitzero"`
	ExitedAt      time.Time      `json:"exited_at,omitzero"`
	ExitReason    api.ReasonCode `json:"exit_reason,omitempty"`
	ExitDetail    string         `json:"exit_detail,omitempty"`
	StopRequested bool           `json:"stop_requested,omitempty"`
	SerialOffset  int64          `json:"serial_offset,omitempty"`
	Tap           string         `json:"tap,omitempty"`
	GuestIP       string         `json:"guest_ip,omitempty"`
	MAC           string         `json:"mac,omitempty"`
	// What Create prepared (host paths).
	Rootfs string `json:"rootfs"`
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd,omitempty"`
	// Config is the guestinit config drive (OCI images); ConfigTmpfs says
	// it lives outside the instance directory, on a tmpfs (it holds
	// secrets), and is removed on Destroy.
	Config      string `json:"config,omitempty"`
	ConfigTmpfs bool   `json:"config_tmpfs,omitempty"`
	// Jailed runs: the jail id and chroot (its root directory).
	JailID string `json:"jail_id,omitempty"`
	Chroot string `json:"chroot,omitempty"`
}

// instance is one instance the runtime knows.
type instance struct {
	id   string
	dir  string
	spec runtime.Spec

	mu      sync.Mutex
	st      persisted
	ready   bool
	adopted bool
	proc    *vmProc
}

func (in *instance) path(name string) string { return filepath.Join(in.dir, name) }

// apiSocket is the host path of the API socket of the instance's process.
func (in *instance) apiSocket(st persisted) string {
	if st.Chroot != "" {
		return filepath.Join(st.Chroot, "run", "firecracker.socket")
	}
	return in.path(apiSockName)
}

func (in *instance) status() runtime.Status {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := runtime.Status{ID: in.id, Owner: in.spec.Owner, State: in.st.State, Ready: in.ready, PID: in.st.PID,
		StartedAt: in.st.StartedAt, ExitedAt: in.st.ExitedAt, ExitReason: in.st.ExitReason, ExitDetail: in.st.ExitDetail,
		Adopted: in.adopted, SerialLog: in.path(serialLogName), Overlay: in.st.Rootfs, Spec: in.spec}
	if s.State == runtime.StateRunning {
		s.Accel = "kvm"
	}
	s.Spec.Secrets = nil
	return s
}

func (in *instance) persistLocked() error {
	b, err := json.MarshalIndent(in.st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(in.path(stateFile), b, 0o600)
}

func (r *Runtime) get(id string) *instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.insts[id]
}

func (r *Runtime) put(in *instance) {
	r.mu.Lock()
	r.insts[in.id] = in
	r.mu.Unlock()
}

func notFound(op, id string) error { return fmt.Errorf("%s %s: %w", op, id, runtime.ErrNotFound) }

// Inspect returns the status of id.
func (r *Runtime) Inspect(_ context.Context, id string) (runtime.Status, error) {
	in := r.get(id)
	if in == nil {
		return runtime.Status{}, notFound("inspect", id)
	}
	return in.status(), nil
}

// List returns every known instance, by id.
func (r *Runtime) List(context.Context) ([]runtime.Status, error) {
	r.mu.Lock()
	out := make([]runtime.Status, 0, len(r.insts))
	insts := make([]*instance, 0, len(r.insts))
	for _, in := range r.insts {
		insts = append(insts, in)
	}
	r.mu.Unlock()
	for _, in := range insts {
		out = append(out, in.status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Subscribe delivers events until ctx ends; one 64 events behind misses some.
func (r *Runtime) Subscribe(ctx context.Context) <-chan runtime.Event {
	ch := make(chan runtime.Event, 64)
	r.subMu.Lock()
	r.subs[ch] = struct{}{}
	r.subMu.Unlock()
	context.AfterFunc(ctx, func() {
		r.subMu.Lock()
		delete(r.subs, ch)
		close(ch)
		r.subMu.Unlock()
	})
	return ch
}

func (r *Runtime) emit(ev runtime.Event) {
	if ev.At.IsZero() {
		ev.At = r.now()
	}
	r.subMu.Lock()
	defer r.subMu.Unlock()
	for ch := range r.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}
