// Package diag owns the diag.health_probe task handler of the node agent: a
// periodic, read-mostly health check of the host it runs on (kernel version,
// memory, KVM, VFIO modules, GPUs, fabric links, root filesystem usage and
// whether the diagnostic path is writable).
//
// It reads sysfs, procfs and devfs below injected roots so that tests can
// point it at fake trees. It must not change host state: the only write is a
// temporary file in the diagnostic path, which it removes again. It must not
// talk to the network, sign or verify tasks, or import other Drover packages
// than internal/wire/api and internal/node/hostinfo (whose PCI, meminfo, module and
// per-OS host readers it shares). Linux-only checks report "not_applicable"
// on other OSes.
package diag

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TaskType is the task type this package handles.
const TaskType = "diag.health_probe"

// Phase names, in the order Probe runs them. Timings are keyed "<phase>_ms".
const (
	PhaseKernel         = "kernel"
	PhaseMemory         = "memory"
	PhaseKVM            = "kvm"
	PhaseVFIO           = "vfio"
	PhaseGPU            = "gpu"
	PhaseFabric         = "fabric"
	PhaseRootFS         = "root_fs"
	PhaseDiagnosticPath = "diagnostic_path"
)

// Stable reason codes carried by Check.Reason.
const (
	ReasonNotApplicable             = "not_applicable"
	ReasonKernelUnavailable         = "kernel_version_unavailable"
	ReasonMemoryUnavailable         = "memory_unavailable"
	ReasonKVMMissing                = "kvm_missing"
	ReasonKVMNotOpenable            = "kvm_not_openable"
	ReasonVFIOModulesMissing        = "vfio_modules_missing"
	ReasonPCIScanFailed             = "pci_scan_failed"
	ReasonFabricLinkDown            = "fabric_link_down"
	ReasonRootFSUnavailable         = "root_fs_unavailable"
	ReasonDiskFull                  = "disk_full"
	ReasonDiagnosticPathUnset       = "diagnostic_path_unset"
	ReasonDiagnosticPathInvalid     = "diagnostic_path_invalid"
	ReasonDiagnosticPathNotWritable = "diagnostic_path_not_writable"
	ReasonTimeout                   = "timeout"
	ReasonCanceled                  = "canceled"
	ReasonInternalError             = "internal_error"
)

// DefaultPhaseTimeout bounds each phase when Config.PhaseTimeout is zero.
const DefaultPhaseTimeout = 10 * time.Second

// Params are the task parameters of diag.health_probe.
type Params struct {
	// DiagnosticPath is an absolute directory to test for writability;
	// empty means Config.DefaultDiagnosticPath (the agent's state dir).
	DiagnosticPath string `json:"diagnostic_path,omitempty"`
}

// DecodeParams decodes and validates raw task params. Empty or null params
// are the zero Params; unknown fields and relative paths are rejected.
func DecodeParams(raw json.RawMessage) (Params, error) {
	var p Params
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return p, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Params{}, fmt.Errorf("diag: decode params: %w", err)
	}
	if p.DiagnosticPath != "" && !filepath.IsAbs(p.DiagnosticPath) {
		return Params{}, fmt.Errorf("diag: diagnostic_path %q must be absolute", p.DiagnosticPath)
	}
	return p, nil
}

// Config tells a Prober where to look. Zero fields take the defaults noted.
type Config struct {
	SysRoot               string // default "/sys"
	ProcRoot              string // default "/proc"
	DevRoot               string // default "/dev"
	RootPath              string // filesystem to measure; default "/" (SystemDrive on windows)
	DefaultDiagnosticPath string // used when Params.DiagnosticPath is empty
	// GOOS selects the Linux-only checks; default runtime.GOOS.
	GOOS string
	// PhaseTimeout bounds each phase; default DefaultPhaseTimeout.
	PhaseTimeout time.Duration
	// Now is the clock used for timings; default time.Now.
	Now func() time.Time
	// KVMVerdict, when set, returns the accelerator probe's verdict on KVM
	// (package accel proves it by running a guest); ok is false while there
	// is none. The kvm check then fails with the verdict's reason when
	// /dev/kvm opens but guests do not really run (kvm_guest_too_slow,
	// kvm_guest_hung, ...), so that the check, the phase's progress event
	// and Healthy agree with the accelerator probe.
	KVMVerdict func() (v KVMVerdict, ok bool)
	// OtherAccel, when set, is the accelerator the host is configured to
	// run VMs with instead of KVM ("tcg", "nvmm", "hvf"): a KVM that does
	// not work is then reported but not_applicable, not a failed check.
	OtherAccel string
}

// KVMVerdict is the accelerator probe's verdict on KVM, as package accel
// reports it (its Status for "kvm"): Reason is one of accel's stable codes.
type KVMVerdict struct {
	Works  bool
	Reason string
	Detail string
}

// Prober runs health probes. It is safe for concurrent use.
type Prober struct {
	cfg Config
	// Hooks for tests; production values are set by NewProber.
	statFS     func(ctx context.Context, path string) (fsUsage, error)
	writeProbe func(dir string) error
}

// NewProber returns a Prober with cfg's defaults filled in.
func NewProber(cfg Config) *Prober {
	if cfg.SysRoot == "" {
		cfg.SysRoot = "/sys"
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.DevRoot == "" {
		cfg.DevRoot = "/dev"
	}
	if cfg.RootPath == "" {
		cfg.RootPath = defaultRootPath()
	}
	if cfg.GOOS == "" {
		cfg.GOOS = runtime.GOOS
	}
	if cfg.PhaseTimeout <= 0 {
		cfg.PhaseTimeout = DefaultPhaseTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Prober{cfg: cfg, statFS: hostFSUsage, writeProbe: writeProbeFile}
}

// Check is the verdict of one phase. Reason is a stable code (Reason*, or for
// the kvm check the accelerator probe's kvm_* code via Config.KVMVerdict) when
// OK is false, or ReasonNotApplicable; Detail is for humans.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// CheckError is the error Probe hands to progress for a failed check.
type CheckError struct{ Check Check }

func (e *CheckError) Error() string {
	if e.Check.Detail == "" {
		return fmt.Sprintf("%s: %s", e.Check.Name, e.Check.Reason)
	}
	return fmt.Sprintf("%s: %s: %s", e.Check.Name, e.Check.Reason, e.Check.Detail)
}

// PCIDevice is one PCI function found under <sys>/bus/pci/devices.
type PCIDevice struct {
	Address    string `json:"address"`
	Vendor     string `json:"vendor"`                // "0x10de"
	VendorName string `json:"vendor_name,omitempty"` // "nvidia", "amd", "intel", "mellanox"
	Device     string `json:"device"`                // "0x2330"
	Class      string `json:"class"`                 // "0x030200"
	NUMANode   int    `json:"numa_node"`             // -1 when unknown
	Driver     string `json:"driver,omitempty"`
}

// FabricLink is one Mellanox network function and, when it has one, one of
// its net interfaces. A function with no interface (e.g. bound to vfio-pci)
// appears once with Interface empty.
type FabricLink struct {
	PCIAddress string `json:"pci_address"`
	Device     string `json:"device"`
	NUMANode   int    `json:"numa_node"`
	Driver     string `json:"driver,omitempty"`
	Interface  string `json:"interface,omitempty"`
	OperState  string `json:"operstate,omitempty"`
	SpeedMbps  int    `json:"speed_mbps"`
	Up         bool   `json:"up"`
}

// KVMStatus reports /dev/kvm.
type KVMStatus struct {
	Present  bool   `json:"present"`
	Path     string `json:"path"`
	Openable bool   `json:"openable"`
	Error    string `json:"error,omitempty"`
}

// VFIOStatus reports whether each VFIO module is loaded or built in.
type VFIOStatus struct {
	Modules map[string]bool `json:"modules"`
}

// GPUStatus lists the GPUs found.
type GPUStatus struct {
	Count   int         `json:"count"`
	Devices []PCIDevice `json:"devices"`
}

// RootFSStatus is the usage of the root filesystem.
type RootFSStatus struct {
	Path        string  `json:"path"`
	TotalGB     float64 `json:"total_gb"`
	UsedGB      float64 `json:"used_gb"`
	FreeGB      float64 `json:"free_gb"`
	UsedPercent float64 `json:"used_percent"`
	// Full is true when UsedPercent >= FullPercent or free space is below
	// FullFreeBytes; the check then fails with ReasonDiskFull.
	Full bool `json:"full"`
}

// Thresholds for RootFSStatus.Full.
const (
	FullPercent   = 98.0
	FullFreeBytes = 100 << 20
)

// DiagnosticPathStatus reports whether the diagnostic path takes a write.
type DiagnosticPathStatus struct {
	Path     string `json:"path"`
	Writable bool   `json:"writable"`
	Error    string `json:"error,omitempty"`
}

// Report is the output of one probe.
type Report struct {
	KernelVersion  string               `json:"kernel_version"`
	OSFamily       string               `json:"os_family"`
	Arch           string               `json:"arch"`
	MemTotalMB     int                  `json:"mem_total_mb"`
	MemFreeMB      int                  `json:"mem_free_mb"`
	MemAvailableMB int                  `json:"mem_available_mb"`
	KVM            KVMStatus            `json:"kvm"`
	VFIO           VFIOStatus           `json:"vfio"`
	GPUs           GPUStatus            `json:"gpus"`
	Fabric         []FabricLink         `json:"fabric"`
	RootFS         RootFSStatus         `json:"root_fs"`
	DiagnosticPath DiagnosticPathStatus `json:"diagnostic_path"`
	// Healthy is true when every check is OK (not_applicable counts as OK).
	// It is derived from Checks only, as are the phases' progress events.
	Healthy bool    `json:"healthy"`
	Checks  []Check `json:"checks"`
	// Timings holds each phase's duration under "<phase>_ms".
	Timings   map[string]int64 `json:"timings"`
	StartedAt time.Time        `json:"started_at"`
}

// ResultTimings returns Timings keyed the way task results carry them:
// "timings.<phase>_ms".
func (r Report) ResultTimings() map[string]int64 {
	out := make(map[string]int64, len(r.Timings))
	for k, v := range r.Timings {
		out["timings."+k] = v
	}
	return out
}

// phaseFunc computes one phase off the caller's goroutine; apply copies
// its findings into the report and runs on the caller's goroutine.
type phaseFunc func(ctx context.Context, params Params) (c Check, apply func(*Report))

// Probe runs every phase in order, each bounded by ctx and the phase
// timeout, and calls progress (when non-nil) after each with the phase's
// duration and, for a failed check, a *CheckError. Failed checks do not make
// Probe fail; it returns an error (wrapping ctx.Err()) only when ctx ends,
// along with the partial report.
func (p *Prober) Probe(ctx context.Context, params Params, progress func(phase string, d time.Duration, err error)) (Report, error) {
	rep := Report{
		OSFamily:  api.OSFamilyOf(p.cfg.GOOS),
		Arch:      runtime.GOARCH,
		VFIO:      VFIOStatus{Modules: map[string]bool{}},
		GPUs:      GPUStatus{Devices: []PCIDevice{}},
		Fabric:    []FabricLink{},
		Checks:    make([]Check, 0, 8),
		Timings:   make(map[string]int64, 8),
		StartedAt: p.cfg.Now(),
	}
	phases := []struct {
		name string
		fn   phaseFunc
	}{
		{PhaseKernel, p.kernelPhase},
		{PhaseMemory, p.memoryPhase},
		{PhaseKVM, p.kvmPhase},
		{PhaseVFIO, p.vfioPhase},
		{PhaseGPU, p.gpuPhase},
		{PhaseFabric, p.fabricPhase},
		{PhaseRootFS, p.rootFSPhase},
		{PhaseDiagnosticPath, p.diagPathPhase},
	}
	for _, ph := range phases {
		if err := ctx.Err(); err != nil {
			rep.Checks = append(rep.Checks, Check{Name: ph.name, Reason: ReasonCanceled})
			continue
		}
		start := p.cfg.Now()
		c, apply := p.runPhase(ctx, ph.name, params, ph.fn)
		d := p.cfg.Now().Sub(start)
		c.Name = ph.name
		if apply != nil {
			apply(&rep)
		}
		rep.Checks = append(rep.Checks, c)
		rep.Timings[ph.name+"_ms"] = d.Milliseconds()
		if progress != nil {
			var perr error
			if !c.OK {
				perr = &CheckError{Check: c}
			}
			progress(ph.name, d, perr)
		}
	}
	rep.Healthy = healthy(rep.Checks)
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("diag: health probe interrupted: %w", err)
	}
	return rep, nil
}

// healthy is the verdict of checks: every one OK.
func healthy(checks []Check) bool {
	for _, c := range checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// runPhase runs fn on its own goroutine so that a phase stuck in a system
// call (a hung filesystem, a wedged device) cannot hold the probe past its
// deadline. An abandoned goroutine only writes to its buffered channel.
func (p *Prober) runPhase(ctx context.Context, name string, params Params, fn phaseFunc) (Check, func(*Report)) {
	pctx, cancel := context.WithTimeout(ctx, p.cfg.PhaseTimeout)
	defer cancel()
	type result struct {
		c     Check
		apply func(*Report)
	}
	ch := make(chan result, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				ch <- result{c: Check{Reason: ReasonInternalError, Detail: fmt.Sprintf("panic: %v", v)}}
			}
		}()
		c, apply := fn(pctx, params)
		ch <- result{c, apply}
	}()
	select {
	case r := <-ch:
		return r.c, r.apply
	case <-pctx.Done():
		if ctx.Err() != nil {
			return Check{Reason: ReasonCanceled, Detail: ctx.Err().Error()}, nil
		}
		return Check{Reason: ReasonTimeout, Detail: fmt.Sprintf("%s phase exceeded %s", name, p.cfg.PhaseTimeout)}, nil
	}
}

// Handle decodes raw params, runs Probe and packages the report as a task
// result. The result is always usable: invalid params or an interrupted
// probe give a failed result and a non-nil error; failed checks still give
// a succeeded result (the probe ran; its verdict is the output's healthy
// and checks, which always agree).
func (p *Prober) Handle(ctx context.Context, raw json.RawMessage, progress func(phase string, d time.Duration, err error)) (api.TaskResult, error) {
	params, err := DecodeParams(raw)
	if err != nil {
		return api.TaskResult{
			Status:     api.ResultFailed,
			Error:      &api.ResultError{Code: "invalid_params", Message: err.Error()},
			FinishedAt: p.cfg.Now(),
		}, err
	}
	rep, perr := p.Probe(ctx, params, progress)
	out, err := json.Marshal(rep)
	if err != nil {
		return api.TaskResult{}, fmt.Errorf("diag: encode report: %w", err)
	}
	res := api.TaskResult{
		Status:     api.ResultSucceeded,
		Output:     out,
		Timings:    rep.ResultTimings(),
		FinishedAt: p.cfg.Now(),
	}
	if perr != nil {
		res.Status = api.ResultFailed
		code := ReasonCanceled
		if errors.Is(perr, context.DeadlineExceeded) {
			code = ReasonTimeout
		}
		res.Error = &api.ResultError{Code: code, Message: perr.Error()}
	}
	return res, perr
}

func notApplicable(goos string) Check {
	return Check{OK: true, Reason: ReasonNotApplicable, Detail: "linux only; host is " + goos}
}
