// Package slicevm owns the slice.vm_provision and slice.vm_release work of
// the node agent: provisioning a VM with its GPU slots passed
// through (per-slot leases, host checks, VFIO binding, image fetch and
// digest check, per-VM terminal key, guest telemetry registration, the
// cloud-init seed, DHCP reservation, the boot NVMe image write, then the
// VM itself through the runtime.Runtime port and its readiness), in the
// 17 timed phases (docs/contract.md) with deferred cleanup on failure; and releasing it
// again (shutdown, undefine, VFIO rebind, file cleanup, optional NVMe wipe,
// lease release).
//
// It launches VMs only through runtime.Runtime (QEMU directly in
// production, never virt-install or libvirt), builds the seed ISO in Go
// (internal/node/cloudinit, never cloud-localds), and never loads kernel
// modules; it installs packages only when Options.InstallDependencies is
// set (a pinned list, apt-get or dnf): otherwise what is missing is a
// blocker in the error. Inside a ready guest it works only over the
// brokered SSH channel (internal/node/guestssh): telemetry, the
// performance probe and the allocation's user. It reads
// and writes sysfs, procfs and devfs only below Options.SysfsRoot, and its
// own files only below StateDir and CloudInitDir.
//
// The device rule. Only the control plane knows which slots an operator
// approved (the agent gets no approval list; a task carries slot params
// as submitted), so the agent checks what it can know itself, even for a
// validly signed task:
// every device a task would touch must be, in the role the task gives it,
// a device of a candidate slot of this host's slice topology, discovered
// afresh (internal/node/slice) when the task starts. A slot's pci_address must
// be some candidate slot's GPU; its fabric_device some candidate slot's
// fabric VF; its nvme_device a clean absolute path (no "..", no "//")
// that resolves, symlinks followed, to the same path as some candidate
// slot's NVMe namespace (a namespace that is mounted, swap or held is
// never a candidate). Schedulability is not required, so that a host
// with a blocker can still release. The devices checked are those a task
// touches: for slice.vm_provision every slot's GPU, fabric VF and NVMe
// namespace (bound, written, or leased for a later wipe); for
// slice.vm_release the GPUs and VFs it rebinds and, with wipe, the NVMe
// namespaces it zeroes, whether params name them or the VM's leases fill
// them in. A device named as a GPU's IOMMU-group companion is not accepted
// (tasks never name one; they are only checked to be unbound or on
// vfio-pci). Besides, a device another VM's lease holds is refused, even
// under another slot id. A refusal comes before anything is touched: an
// *Error with Code CodeDeviceNotAllowed (or CodeLeaseConflict), Phase
// PhaseDeviceCheck, and Fields naming each param, e.g.
// "params.slots[0].pci_address: 0000:3b:00.0 is not a device of an
// approved slot on this host".
package slicevm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/slice"
	"github.com/drover-dev/drover/internal/node/slicedhcp"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Provision phases, in the order Provision runs them (docs/contract.md). Timings
// are keyed "<phase>_ms".
const (
	PhaseLeaseAcquire          = "lease_acquire"
	PhaseHostDependencies      = "host_dependencies"
	PhaseHostPassthroughCheck  = "host_passthrough_check"
	PhaseVFIOBindCheck         = "vfio_bind_check"
	PhaseImageStatDownload     = "image_stat_download"
	PhaseImageDigestVerify     = "image_digest_verify"
	PhaseCloudInitDir          = "cloud_init_dir"
	PhaseTerminalKey           = "terminal_key"
	PhaseGuestTelemetry        = "guest_telemetry_register"
	PhaseCloudInitSeedFiles    = "cloud_init_seed_files"
	PhaseCloudLocalDS          = "cloud_localds"
	PhaseRuntimeValidate       = "runtime_validate"
	PhaseDHCPReservation       = "dhcp_reservation"
	PhaseImageWriteConvert     = "image_write_convert"
	PhaseVirtInstall           = "virt_install"
	PhaseReadiness             = "readiness"
	PhasePerformanceProbe      = "performance_probe"
	CleanupVM                  = "cleanup_vm"
	CleanupDHCP                = "cleanup_dhcp"
	CleanupTelemetry           = "cleanup_telemetry"
	CleanupLeases              = "cleanup_leases"
	CleanupCloudInitDir        = "cleanup_cloud_init_dir"
	ReleaseShutdown            = "shutdown"
	ReleaseUndefine            = "undefine"
	ReleaseVFIORebind          = "vfio_rebind"
	ReleaseRemoveCloudInitDir  = "remove_cloud_init_dir"
	ReleaseDropDHCP            = "drop_dhcp_reservation"
	ReleaseWipe                = "wipe"
	ReleaseLeases              = "release_leases"
	ReleaseUnregisterTelemetry = "unregister_telemetry"
)

// ProvisionPhases returns the provision phases in order (a fresh slice).
func ProvisionPhases() []string {
	return []string{PhaseLeaseAcquire, PhaseHostDependencies, PhaseHostPassthroughCheck, PhaseVFIOBindCheck,
		PhaseImageStatDownload, PhaseImageDigestVerify, PhaseCloudInitDir, PhaseTerminalKey, PhaseGuestTelemetry,
		PhaseCloudInitSeedFiles, PhaseCloudLocalDS, PhaseRuntimeValidate, PhaseDHCPReservation,
		PhaseImageWriteConvert, PhaseVirtInstall, PhaseReadiness, PhasePerformanceProbe}
}

// Owner is the runtime.Spec owner of slice VMs.
const Owner = "slice"

// ReadyFile is the guest file cloud-init touches just before it prints the
// readiness marker.
const ReadyFile = "/var/lib/drover/slice-ready"

// Error codes (Error.Code).
const (
	CodeLeaseConflict      = "lease_conflict"
	CodeLeaseFailed        = "lease_failed"
	CodeMissingDependency  = "missing_dependency"
	CodeAccelUnavailable   = "accel_unavailable"
	CodePassthroughMissing = "passthrough_unavailable"
	CodeVFIOBindFailed     = "vfio_bind_failed"
	CodeImagePathNotAllow  = "image_path_not_allowed"
	CodeImageDigest        = "image_digest_mismatch"
	CodeImageFetchFailed   = "image_fetch_failed"
	CodeCloudInitFailed    = "cloud_init_failed"
	CodeTerminalKeyFailed  = "terminal_key_failed"
	CodeTelemetryFailed    = "telemetry_register_failed"
	CodeRuntimeInvalid     = "runtime_validate_failed"
	CodeDHCPFailed         = "dhcp_reservation_failed"
	CodeImageWriteFailed   = "image_write_failed"
	CodeVMNameInUse        = "vm_name_in_use"
	CodeVMCreateFailed     = "vm_create_failed"
	CodeVMStartFailed      = "vm_start_failed"
	CodeReadinessFailed    = "readiness_failed"
	CodeProbeFailed        = "performance_probe_failed"
	CodeVMStopFailed       = "vm_stop_failed"
	CodeVMDestroyFailed    = "vm_destroy_failed"
	CodeCleanupFailed      = "cleanup_failed"
	CodeWipeFailed         = "wipe_failed"
	CodeCanceled           = "canceled"
	// CodeDeviceNotAllowed: the task names a device outside the device
	// rule (Error.Fields name each one; errors.Is ErrDeviceNotAllowed).
	CodeDeviceNotAllowed = "device_not_allowed"
	// CodeTopologyFailed: the host's slots could not be discovered, so
	// no device could be checked.
	CodeTopologyFailed = "topology_discover_failed"
	// CodeImageUnsafe: the base image names a host file qemu-img would
	// read (a backing file, a qcow2 external data file) or is neither
	// qcow2 nor raw (errors.Is image.ErrUnsafeImage; Error.Fields names
	// params.image_path or params.image_url).
	CodeImageUnsafe = "image_unsafe"
)

// Error is a failed phase: an api.CodedError (its own type, so the agent's
// errors.As tells it apart) whose Code is stable (Code* constants) and whose
// Fields name the params (or leases) refused by the device rule, or the
// image param of an unsafe image (CodeImageUnsafe); Err is the underlying
// cause, if any. Blocker, when set, names what the host lacks in
// slice.topology_discover's style ("command_missing:qemu-img",
// "vfio_not_bound:0000:18:00.0"): an operator fixes it, a retry will not.
type Error struct {
	api.CodedError
	Blocker string
}

// Error is "slicevm: phase: code: message[ (blocker X)]" (the cause is not
// repeated; Message already carries it).
func (e *Error) Error() string {
	s := fmt.Sprintf("slicevm: %s: %s: %s", e.Phase, e.Code, e.Message)
	if e.Blocker != "" {
		s += " (blocker " + e.Blocker + ")"
	}
	return s
}

// failf builds an *Error; the phase runner fills in Phase.
func failf(code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{CodedError: api.CodedError{Code: code, Message: err.Error(), Err: errors.Unwrap(err)}}
}

// blockf builds an *Error naming a host blocker.
func blockf(code, blocker, format string, args ...any) *Error {
	e := failf(code, format, args...)
	e.Blocker = blocker
	return e
}

// Options configures a Provisioner. Runtime, Images, StateDir and
// CloudInitDir are required.
type Options struct {
	Runtime runtime.Runtime
	Images  *image.Cache
	// SysfsRoot is the root below which sys/, proc/ and dev/kvm are read
	// ("/" in production; a fake tree in tests, as in internal/node/slice).
	SysfsRoot string
	// StateDir holds leases/, dhcp-hosts.d/ (the default DHCP store),
	// telemetry/ and keys/.
	StateDir string
	// DHCP holds the slots' DHCP reservations that dhcp_reservation
	// writes and a release drops; the agent's slice DHCP server answers
	// from it (default: a store in StateDir/dhcp-hosts.d with no subnet
	// check, which only dnsmasq pointed at it would serve).
	DHCP *slicedhcp.Store
	// CloudInitDir holds one directory per VM.
	CloudInitDir string
	// DeviceDirs are the directories nvme_device must lie in, before and
	// after resolving symlinks (default /dev).
	DeviceDirs []string
	// LookPath finds commands (default exec.LookPath).
	LookPath func(string) (string, error)
	// QEMUImg is the qemu-img binary (default: found with LookPath).
	QEMUImg string
	// CheckAccel, when set, says whether the accelerator a VM would use
	// works on this host ("" means the runtime's selection); the agent
	// backs it with internal/node/accel's verdict. Without it
	// host_passthrough_check reports the accelerator as not checked.
	CheckAccel func(ctx context.Context, accel string) error
	// Topology discovers this host's slots for the device rule (default:
	// internal/node/slice's discovery below SysfsRoot, run afresh for each
	// task that names devices).
	Topology func(ctx context.Context) (slice.Topology, error)
	// InstallDependencies lets host_dependencies install the pinned
	// packages (DependencyPackages) that provide missing commands, with
	// apt-get or dnf as /etc/os-release (below SysfsRoot) says; off, a
	// missing command is only a blocker.
	InstallDependencies bool
	// InstallTimeout bounds such an install (default
	// DefaultInstallTimeout).
	InstallTimeout time.Duration
	// GOARCH picks qemu-system-<arch> (default the agent's own).
	GOARCH string
	Log    *slog.Logger
	Now    func() time.Time
}

// Provisioner provisions and releases slice VMs. It is safe for concurrent
// use; calls on one vm_name are serialised.
type Provisioner struct {
	opts  Options
	mu    sync.Mutex
	locks map[string]*vmLock
	// leaseMu serialises taking leases across VMs, so that two VMs cannot
	// both lease one device under different slot ids.
	leaseMu sync.Mutex
}

type vmLock struct {
	mu   sync.Mutex
	refs int
}

// New checks opts and fills in defaults. It creates nothing on disk.
func New(opts Options) (*Provisioner, error) {
	switch {
	case opts.Runtime == nil:
		return nil, errors.New("slicevm: options: runtime is required")
	case opts.Images == nil:
		return nil, errors.New("slicevm: options: image cache is required")
	case opts.StateDir == "" || !filepath.IsAbs(opts.StateDir):
		return nil, fmt.Errorf("slicevm: options: state dir %q must be an absolute path", opts.StateDir)
	case opts.CloudInitDir == "" || !filepath.IsAbs(opts.CloudInitDir):
		return nil, fmt.Errorf("slicevm: options: cloud-init dir %q must be an absolute path", opts.CloudInitDir)
	}
	if opts.SysfsRoot == "" {
		opts.SysfsRoot = "/"
	}
	if len(opts.DeviceDirs) == 0 {
		opts.DeviceDirs = []string{"/dev"}
	}
	for i, d := range opts.DeviceDirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("slicevm: options: device_dirs[%d] %q is not absolute", i, d)
		}
		opts.DeviceDirs[i] = filepath.Clean(d)
	}
	if opts.GOARCH == "" {
		opts.GOARCH = goruntime.GOARCH
	}
	if opts.LookPath == nil {
		opts.LookPath = exec.LookPath
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Topology == nil {
		opts.Topology = defaultTopology(opts)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.DHCP == nil {
		st, err := slicedhcp.OpenStore(filepath.Join(opts.StateDir, "dhcp-hosts.d"), netip.Prefix{})
		if err != nil {
			return nil, fmt.Errorf("slicevm: options: %w", err)
		}
		opts.DHCP = st
	}
	return &Provisioner{opts: opts, locks: map[string]*vmLock{}}, nil
}

func (p *Provisioner) goarch() string { return p.opts.GOARCH }

// lockVM serialises work on one vm_name; call the returned func to unlock.
func (p *Provisioner) lockVM(name string) func() {
	p.mu.Lock()
	l := p.locks[name]
	if l == nil {
		l = &vmLock{}
		p.locks[name] = l
	}
	l.refs++
	p.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		p.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(p.locks, name)
		}
		p.mu.Unlock()
	}
}

// PhaseResult is one finished phase (or cleanup step) in an output.
type PhaseResult struct {
	Phase      string `json:"phase"`
	DurationMS int64  `json:"duration_ms"`
	Status     string `json:"status"` // "ok", "skipped" or "failed"
	Detail     string `json:"detail,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Phase statuses.
const (
	StatusOK      = "ok"
	StatusSkipped = "skipped"
	StatusFailed  = "failed"
)

// step is what a phase function reports: a detail line, and whether it
// did nothing ("skipped: ...").
type step struct {
	detail  string
	skipped bool
}

func done(format string, args ...any) step { return step{detail: fmt.Sprintf(format, args...)} }
func skipped(format string, args ...any) step {
	return step{detail: "skipped: " + fmt.Sprintf(format, args...), skipped: true}
}

// phase is one named step of a flow.
type phase struct {
	name string
	fn   func(context.Context) (step, error)
}

// tracker times phases, reports them through progress and records them.
type tracker struct {
	now      func() time.Time
	progress func(phase string, d time.Duration, err error)
	timings  map[string]int64
	results  []PhaseResult
}

func newTracker(now func() time.Time, progress func(string, time.Duration, error)) *tracker {
	return &tracker{now: now, progress: progress, timings: map[string]int64{}}
}

// run runs one phase. A failure comes back as an *Error naming the phase
// (context errors become CodeCanceled).
func (t *tracker) run(ctx context.Context, name string, fn func(context.Context) (step, error)) (step, error) {
	start := t.now()
	var st step
	err := ctx.Err()
	if err == nil {
		st, err = fn(ctx)
	}
	d := t.now().Sub(start)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			code := name + "_failed"
			if ctx.Err() != nil {
				code = CodeCanceled
			}
			e = &Error{CodedError: api.CodedError{Code: code, Message: err.Error(), Err: err}}
		}
		if e.Phase == "" {
			e.Phase = name
		}
		err = e
	}
	t.record(name, d, st, err)
	return st, err
}

func (t *tracker) record(name string, d time.Duration, st step, err error) {
	t.timings[name+"_ms"] = d.Milliseconds()
	r := PhaseResult{Phase: name, DurationMS: d.Milliseconds(), Status: StatusOK, Detail: st.detail}
	switch {
	case err != nil:
		r.Status, r.Error = StatusFailed, err.Error()
	case st.skipped:
		r.Status = StatusSkipped
	}
	t.results = append(t.results, r)
	if t.progress != nil {
		t.progress(name, d, err)
	}
}
