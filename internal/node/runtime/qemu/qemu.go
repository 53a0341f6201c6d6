// Package qemu is the QEMU adapter of runtime.Runtime: it turns a
// runtime.Spec into a qcow2 overlay over a cached base image (or a raw boot
// device), a cloud-init seed ISO and a daemonized QEMU process that outlives
// the agent, watched through one QMP connection per running instance (a
// hand-written client, qmp.go) and through its serial log for readiness.
// State lives in Root/instances/<id>/ (spec.json without secrets,
// state.json, qmp.sock, serial.sock, serial.log, qemu.pid, seed.iso);
// overlays in OverlayDir. Recover re-adopts running QEMUs after an agent
// restart; SweepOrphans removes overlays no instance owns.
//
// It must not choose the accelerator (the agent proves and passes one, see
// internal/node/accel), fetch images itself (internal/node/image does), render
// cloud-init (internal/node/cloudinit does), or know about the control plane.
package qemu

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/vmcgroup"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Options configures a Runtime.
type Options struct {
	// Root holds the state: Root/instances/<id>/. Keep it short: unix
	// socket paths under it are limited to 107 bytes.
	Root string
	// OverlayDir holds the per-instance overlays <id>.qcow2 (default
	// Root/overlays).
	OverlayDir string
	// Images fetches and verifies base images, kernels and initrds.
	Images *image.Cache
	// Accel is the accelerator the agent selected (kvm on linux, nvmm on
	// dragonfly, hvf, tcg). A spec may only ask for it or for tcg.
	Accel string
	// QEMUBinary defaults to qemu-system-<arch of GOARCH>; QEMUImg to
	// "qemu-img".
	QEMUBinary string
	QEMUImg    string
	// DeviceDirs are the allowed BootDevice prefixes (default
	// /dev/disk/by-id and /dev/nvme).
	DeviceDirs []string
	// OrphanGrace is how old an overlay no instance owns must be before
	// SweepOrphans removes it (default 10m).
	OrphanGrace time.Duration
	// OnOrphanRemoved is called with the path of every removed orphan
	// overlay (the agent counts them).
	OnOrphanRemoved func(path string)
	// MicroVM, when set, turns on the microVM mode (microvm.go).
	MicroVM *MicroVMOptions
	// Cgroups, when set, puts every QEMU process in a memory cgroup of its
	// own (limit: the guest's memory plus CgroupOverheadMiB, default
	// DefaultCgroupOverheadMiB); an exit after a kernel OOM kill in it is
	// crashed with reason oom_killed.
	Cgroups           *vmcgroup.Manager
	CgroupOverheadMiB int
	Log               *slog.Logger
	Now               func() time.Time
}

// File names inside an instance directory.
const (
	specFile      = "spec.json"
	stateFile     = "state.json"
	pidFileName   = "qemu.pid"
	serialLogName = "serial.log"
	seedName      = "seed.iso"
	seedDirName   = "seed"
)

// errUnsupportedOS is New's answer on an OS without -daemonize and unix
// signals (windows).
var errUnsupportedOS = errors.New("qemu: the QEMU runtime needs a unix host (-daemonize, signals)")

// Runtime is the QEMU runtime. Its methods are safe for concurrent use;
// calls on one id are serialised.
type Runtime struct {
	opts       Options
	instDir    string
	overlayDir string
	arch       string
	log        *slog.Logger
	now        func() time.Time

	locksMu sync.Mutex
	locks   map[string]*idLock

	mu    sync.Mutex // guards insts; never held while taking an instance's mu
	insts map[string]*instance

	subMu sync.Mutex
	subs  map[chan runtime.Event]struct{}

	infoMu sync.Mutex
	infos  map[infoKey]image.Info // accepted base images (Inspect)

	digestKey []byte // keys secretsDigest; random, in memory only

	// pickPorts chooses the forwards' host ports (pickPorts; a test's
	// picker hands out a taken port).
	pickPorts func([]api.PortForward) (map[string]int, error)

	wg sync.WaitGroup // monitor and readiness goroutines
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks opts and creates the state directories.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	_ = ctx // nothing blocks here
	if !supportedOS {
		return nil, errUnsupportedOS
	}
	if opts.Root == "" {
		return nil, errors.New("qemu: options: root is required")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("qemu: options: root: %w", err)
	}
	opts.Root = root
	if opts.OverlayDir == "" {
		opts.OverlayDir = filepath.Join(root, "overlays")
	}
	if opts.OverlayDir, err = filepath.Abs(opts.OverlayDir); err != nil {
		return nil, fmt.Errorf("qemu: options: overlay dir: %w", err)
	}
	if opts.Images == nil {
		return nil, errors.New("qemu: options: images (an *image.Cache) is required")
	}
	if !slices.Contains(knownAccels, opts.Accel) {
		return nil, fmt.Errorf("qemu: options: accel %q: want one of %v", opts.Accel, knownAccels)
	}
	if opts.QEMUBinary == "" {
		opts.QEMUBinary = accel.QEMUBinary(goruntime.GOARCH)
	}
	if opts.QEMUImg == "" {
		opts.QEMUImg = "qemu-img"
	}
	if opts.DeviceDirs == nil {
		opts.DeviceDirs = []string{"/dev/disk/by-id", "/dev/nvme"}
	}
	if opts.OrphanGrace <= 0 {
		opts.OrphanGrace = 10 * time.Minute
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if mv := opts.MicroVM; mv != nil && mv.TSCKHz == 0 && goruntime.GOOS == "linux" && goruntime.GOARCH == "amd64" {
		c := *mv // the caller's options stay as given
		c.TSCKHz = hostTSCKHz("/proc/cpuinfo")
		opts.MicroVM = &c
	}
	r := &Runtime{
		opts:       opts,
		instDir:    filepath.Join(root, "instances"),
		overlayDir: opts.OverlayDir,
		arch:       goruntime.GOARCH,
		log:        opts.Log.With("runtime", "qemu"),
		now:        opts.Now,
		locks:      map[string]*idLock{},
		insts:      map[string]*instance{},
		subs:       map[chan runtime.Event]struct{}{},
		infos:      map[infoKey]image.Info{},
		digestKey:  make([]byte, 32),
		pickPorts:  pickPorts,
	}
	if _, err := rand.Read(r.digestKey); err != nil {
		return nil, fmt.Errorf("qemu: digest key: %w", err)
	}
	for _, d := range []string{root, r.instDir, r.overlayDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("qemu: state dir: %w", err)
		}
	}
	return r, nil
}

// Name is "qemu".
func (r *Runtime) Name() string { return Name }

// Close lets go of every instance without stopping it, as an agent that
// exits does: QMP connections close, watching stops, and the Runtime
// forgets its instances (a Recover, on this or another Runtime over the same
// Root, adopts them again). Call it when no other call is in flight.
func (r *Runtime) Close() error {
	r.mu.Lock()
	insts := r.insts
	r.insts = map[string]*instance{}
	r.mu.Unlock()
	for _, in := range insts {
		in.mu.Lock()
		p := in.proc
		in.mu.Unlock()
		if p != nil {
			p.detach()
		}
	}
	r.wg.Wait()
	return nil
}

// idLock serialises the operations on one id.
type idLock struct {
	mu sync.Mutex
	n  int
}

func (r *Runtime) lockID(id string) (unlock func()) {
	r.locksMu.Lock()
	l := r.locks[id]
	if l == nil {
		l = &idLock{}
		r.locks[id] = l
	}
	l.n++
	r.locksMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		r.locksMu.Lock()
		if l.n--; l.n == 0 {
			delete(r.locks, id)
		}
		r.locksMu.Unlock()
	}
}

// persisted is state.json: what a new agent needs to re-adopt or report
// the instance. It never holds secrets.
type persisted struct {
	State         runtime.State  `json:"state"`
	PID           int            `json:"pid,omitempty"`
	Accel         string         `json:"accel,omitempty"`
	StartedAt     time.Time      `json:"started_at,omitzero"`
	ExitedAt      time.Time      `json:"exited_at,omitzero"`
	ExitReason    api.ReasonCode `json:"exit_reason,omitempty"`
	ExitDetail    string         `json:"exit_detail,omitempty"`
	Ports         map[string]int `json:"ports,omitempty"`
	Tap           string         `json:"tap,omitempty"`
	LeaseIP       string         `json:"lease_ip,omitempty"`      // a microVM's netsetup address (mode bridge)
	SerialOffset  int64          `json:"serial_offset,omitempty"` // serial.log size when this run started
	StopRequested bool           `json:"stop_requested,omitempty"`
	// SecretNames are the names of the instance's secrets (never their
	// values, nor a digest of them: instance.digest is in memory only).
	SecretNames []string `json:"secret_names,omitempty"`
	// What Create prepared.
	Disk       string `json:"disk"`
	DiskFormat string `json:"disk_format"`
	BlockDisk  bool   `json:"block_disk,omitempty"`
	Overlay    string `json:"overlay,omitempty"`
	Seed       string `json:"seed,omitempty"`
	// SeedInMemory: the seed holds secrets and lives only in the agent's
	// memory (instance.seed; memseed.go); Seed is empty.
	SeedInMemory bool   `json:"seed_in_memory,omitempty"`
	Kernel       string `json:"kernel,omitempty"`
	Initrd       string `json:"initrd,omitempty"`

	// Volumes are a microVM's named volumes as Create attached them
	// (microvm_volumes.go).
	Volumes []VolumeDrive `json:"volumes,omitempty"`
}

// instance is one instance the runtime knows.
type instance struct {
	id   string
	dir  string
	spec runtime.Spec // fixed at Create

	mu      sync.Mutex // guards the fields below
	st      persisted
	ready   bool
	adopted bool
	proc    *vmProc  // the running process, nil when none is watched
	seed    *os.File // the in-memory seed (persisted.SeedInMemory); nil when gone
	// digest is secretsDigest of the secrets Create was given, known
	// only to the agent that created the instance (digestKnown).
	digest      string
	digestKnown bool
}

func (in *instance) path(name string) string { return filepath.Join(in.dir, name) }

// status returns the instance's Status.
func (in *instance) status() runtime.Status {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.statusLocked()
}

func (in *instance) statusLocked() runtime.Status {
	st := runtime.Status{
		ID:           in.id,
		Owner:        in.spec.Owner,
		State:        in.st.State,
		Ready:        in.ready,
		PID:          in.st.PID,
		Accel:        in.st.Accel,
		StartedAt:    in.st.StartedAt,
		ExitedAt:     in.st.ExitedAt,
		ExitReason:   in.st.ExitReason,
		ExitDetail:   in.st.ExitDetail,
		Adopted:      in.adopted,
		SerialSocket: in.path(serialSock),
		SerialLog:    in.path(serialLogName),
		Overlay:      in.st.Overlay,
		Spec:         in.spec,
	}
	if len(in.st.Ports) > 0 {
		st.Ports = make(map[string]int, len(in.st.Ports))
		for k, v := range in.st.Ports {
			st.Ports[k] = v
		}
	}
	st.Spec.Secrets = nil
	return st
}

// persistLocked writes state.json atomically; in.mu is held.
func (in *instance) persistLocked() error {
	b, err := json.MarshalIndent(in.st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(in.path(stateFile), b, 0o600)
}

// get returns the known instance id, or nil.
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

func (r *Runtime) forget(id string) {
	r.mu.Lock()
	delete(r.insts, id)
	r.mu.Unlock()
}

func notFound(op, id string) error {
	return fmt.Errorf("%s %s: %w", op, id, runtime.ErrNotFound)
}

// Inspect returns the status of id.
func (r *Runtime) Inspect(ctx context.Context, id string) (runtime.Status, error) {
	in := r.get(id)
	if in == nil {
		return runtime.Status{}, notFound("inspect", id)
	}
	return in.status(), nil
}

// List returns every known instance, by id.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	r.mu.Lock()
	insts := make([]*instance, 0, len(r.insts))
	for _, in := range r.insts {
		insts = append(insts, in)
	}
	r.mu.Unlock()
	out := make([]runtime.Status, 0, len(insts))
	for _, in := range insts {
		out = append(out, in.status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Subscribe delivers events until ctx ends; a subscriber that falls 64
// events behind misses events.
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
