package accel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultTimeout bounds each step of a probe (the KVM guest, one QEMU call).
const DefaultTimeout = 3 * time.Second

// Runner runs a program to completion (or until ctx ends) and returns its
// standard output.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// Config is what a Prober needs from its host. Zero fields take the real
// host's values.
type Config struct {
	GOOS     string                            // default runtime.GOOS
	GOARCH   string                            // default runtime.GOARCH
	DevRoot  string                            // default "/dev"
	ProcRoot string                            // default "/proc" (linux boot id)
	QEMU     string                            // QEMU binary name or path; default qemu-system-<arch of GOARCH>
	LookPath func(file string) (string, error) // default exec.LookPath
	Run      Runner                            // default: os/exec, output bounded by ctx
	Timeout  time.Duration                     // per step; default DefaultTimeout
	CacheDir string                            // where the verdict is cached (the agent's state dir); "" disables the cache
	Now      func() time.Time                  // default time.Now

	// KVMChild returns the command that proves KVM in a child process; the
	// Prober sets its stdio, starts it and kills it after Timeout. The
	// command must end up in MaybeRunChild. Nil means
	// ChildCommand(DevRoot/kvm, Timeout).
	KVMChild func() (*exec.Cmd, error)
}

// Prober probes a host's accelerators. It holds no state between probes
// other than what it caches on disk; it is safe for concurrent use.
type Prober struct {
	cfg Config
}

// New returns a Prober for cfg, its zero fields filled with the host's.
func New(cfg Config) *Prober {
	if cfg.GOOS == "" {
		cfg.GOOS = runtime.GOOS
	}
	if cfg.GOARCH == "" {
		cfg.GOARCH = runtime.GOARCH
	}
	if cfg.DevRoot == "" {
		cfg.DevRoot = "/dev"
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.QEMU == "" {
		cfg.QEMU = QEMUBinary(cfg.GOARCH)
	}
	if cfg.LookPath == nil {
		cfg.LookPath = exec.LookPath
	}
	if cfg.Run == nil {
		cfg.Run = execRun
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.KVMChild == nil {
		dev, timeout := filepath.Join(cfg.DevRoot, "kvm"), cfg.Timeout
		cfg.KVMChild = func() (*exec.Cmd, error) { return ChildCommand(dev, timeout) }
	}
	return &Prober{cfg: cfg}
}

// QEMUBinary is the qemu-system binary that runs guests of the host's own
// architecture goarch.
func QEMUBinary(goarch string) string {
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "386": "i386", "ppc64le": "ppc64",
		"ppc64": "ppc64", "riscv64": "riscv64", "s390x": "s390x", "loong64": "loongarch64"}[goarch]
	if arch == "" {
		arch = goarch
	}
	return "qemu-system-" + arch
}

// hostAccel is the hardware accelerator of an OS (the one that is probed).
func hostAccel(goos string) string {
	switch goos {
	case "linux":
		return KVM
	case "dragonfly":
		return NVMM
	case "darwin":
		return HVF
	}
	return ""
}

// Probe probes every accelerator now (no cache read) and caches the result,
// unless it is inconclusive (the probe child or QEMU failed to answer, which
// may pass). It fails only when ctx ends before the probe is done, or when
// the cache cannot be written; in the latter case the returned Result is
// complete and the error is a *CacheError.
func (p *Prober) Probe(ctx context.Context) (Result, error) {
	c := p.cfg
	res := Result{ProbedAt: c.Now().UTC()}
	key, keyErr := p.cacheKey()
	if keyErr == nil {
		res.BootID = key.BootID
	}

	var q qemuInfo
	var wg sync.WaitGroup
	wg.Go(func() { q = p.qemu(ctx) })
	hw := hostAccel(c.GOOS)
	var hwStatus Status
	if hw != "" {
		start := time.Now()
		switch hw {
		case KVM:
			hwStatus = p.probeKVM(ctx)
		case NVMM:
			hwStatus = p.probeNVMM()
		case HVF:
			hwStatus = p.probeHVF(ctx)
		}
		hwStatus.Name = hw
		hwStatus.DurationMS = time.Since(start).Milliseconds()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("accelerator probe: %w", err)
	}

	for _, name := range Names() {
		var s Status
		switch {
		case name == TCG:
			s = q.tcgStatus()
		case name == hw:
			s = q.withQEMU(hwStatus)
		default:
			s = Status{Name: name, Reason: ReasonNotApplicable, Detail: notApplicable(name, c.GOOS, q)}
		}
		res.Accelerators = append(res.Accelerators, s)
		if s.Works {
			res.Working = append(res.Working, name)
		}
	}
	if res.Working == nil {
		res.Working = []string{}
	}
	if inconclusive(res) {
		return res, nil
	}
	if err := p.store(key, keyErr, res); err != nil {
		return res, err
	}
	return res, nil
}

// inconclusive reports whether a Result says more about the probe's
// machinery than about the host, and so must not be cached for the boot.
func inconclusive(res Result) bool {
	for _, s := range res.Accelerators {
		if s.Reason == ReasonKVMChildFailed || s.Reason == ReasonQEMUFailed {
			return true
		}
	}
	return false
}

func notApplicable(name, goos string, q qemuInfo) string {
	d := map[string]string{KVM: "kvm is linux only", NVMM: "nvmm is dragonfly only", HVF: "hvf is darwin only"}[name]
	if goos == "windows" && slices.Contains(q.accels, "whpx") {
		d += "; whpx (listed by QEMU) is not probed"
	}
	return d
}

// probeKVM proves /dev/kvm by running a minimal guest in a child process.
func (p *Prober) probeKVM(ctx context.Context) Status {
	dev := filepath.Join(p.cfg.DevRoot, "kvm")
	if _, err := os.Stat(dev); errors.Is(err, fs.ErrNotExist) {
		return Status{Reason: ReasonKVMDeviceMissing, Detail: dev + " does not exist (kvm module not loaded, or no virtualisation extensions)"}
	} else if err != nil {
		return Status{Reason: ReasonKVMOpenFailed, Detail: err.Error()}
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return Status{Reason: ReasonKVMOpenFailed, Detail: err.Error()}
	}
	f.Close()
	if !kvmGuestArch(p.cfg.GOARCH) {
		return Status{Reason: ReasonKVMUnsupportedArch, Detail: dev + " opens, but there is no probe guest for " + p.cfg.GOARCH}
	}
	return p.runKVMChild(ctx)
}

// kvmGuestArch reports whether the KVM child has a probe guest for goarch.
func kvmGuestArch(goarch string) bool { return goarch == "amd64" || goarch == "arm64" }

// probeNVMM checks that /dev/nvmm exists and opens read-write.
func (p *Prober) probeNVMM() Status {
	dev := filepath.Join(p.cfg.DevRoot, "nvmm")
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Status{Reason: ReasonNVMMDeviceMissing, Detail: dev + " does not exist (nvmm module not loaded?)"}
	case err != nil:
		return Status{Reason: ReasonNVMMOpenFailed, Detail: err.Error()}
	}
	f.Close()
	return Status{Works: true, Reason: ReasonOK, Detail: dev + " opens read-write (no guest is run)"}
}

// probeHVF reads kern.hv_support.
func (p *Prober) probeHVF(ctx context.Context) Status {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	out, err := p.cfg.Run(ctx, "/usr/sbin/sysctl", "-n", "kern.hv_support")
	if err != nil {
		return Status{Reason: ReasonHVFProbeFailed, Detail: "sysctl -n kern.hv_support: " + err.Error()}
	}
	if v := strings.TrimSpace(string(out)); v != "1" {
		return Status{Reason: ReasonHVFUnsupported, Detail: fmt.Sprintf("kern.hv_support is %q", v)}
	}
	return Status{Works: true, Reason: ReasonOK, Detail: "kern.hv_support is 1"}
}

// qemuInfo is what `qemu-system-<arch> -accel help` said.
type qemuInfo struct {
	binary string   // the name looked up
	path   string   // "" when not found
	accels []string // accelerators QEMU lists
	err    error    // lookup or run failure
	reason string   // ReasonQEMUMissing or ReasonQEMUFailed with err
	took   time.Duration
}

func (p *Prober) qemu(ctx context.Context) qemuInfo {
	start := time.Now()
	q := qemuInfo{binary: p.cfg.QEMU}
	defer func() { q.took = time.Since(start) }()
	path, err := p.cfg.LookPath(q.binary)
	if err != nil {
		q.err, q.reason = err, ReasonQEMUMissing
		return q
	}
	q.path = path
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	out, err := p.cfg.Run(ctx, path, "-accel", "help")
	if err != nil {
		q.err, q.reason = err, ReasonQEMUFailed
		return q
	}
	q.accels = parseAccelHelp(out)
	return q
}

// parseAccelHelp reads `-accel help`: a header line ending in ':' and one
// accelerator per line.
func parseAccelHelp(out []byte) []string {
	var names []string
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.ContainsAny(line, ": \t") {
			continue
		}
		names = append(names, strings.ToLower(line))
	}
	return names
}

func (q qemuInfo) describe() string {
	switch {
	case q.reason == ReasonQEMUMissing && errors.Is(q.err, exec.ErrNotFound):
		return q.binary + " not found on PATH"
	case q.reason == ReasonQEMUMissing:
		return fmt.Sprintf("%s not found: %v", q.binary, q.err)
	case q.err != nil:
		return fmt.Sprintf("%s -accel help: %v", q.path, q.err)
	}
	return fmt.Sprintf("%s lists %s", q.path, strings.Join(q.accels, ", "))
}

func (q qemuInfo) tcgStatus() Status {
	s := Status{Name: TCG, DurationMS: q.took.Milliseconds(), Detail: "qemu: " + q.describe()}
	switch {
	case q.reason != "":
		s.Reason = q.reason
	case !slices.Contains(q.accels, TCG):
		s.Reason = ReasonQEMUAccelMissing
	default:
		s.Works, s.Reason = true, ReasonOK
	}
	return s
}

// withQEMU adds QEMU's view to a hardware accelerator's verdict. A host that
// runs the accelerator with a QEMU that does not list it does not work; with
// no QEMU at all the host's verdict stands (tcg then says qemu_missing).
func (q qemuInfo) withQEMU(s Status) Status {
	if q.reason == "" && !slices.Contains(q.accels, s.Name) && s.Works {
		s.Works, s.Reason = false, ReasonQEMUAccelMissing
		s.Detail += "; but " + s.Name + " is not in QEMU's accelerators"
	}
	if s.Detail != "" {
		s.Detail += "; "
	}
	s.Detail += "qemu: " + q.describe()
	return s
}

// execRun is the default Runner.
func execRun(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, firstLine(msg))
		}
	}
	return out, err
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	if len(line) > 200 {
		line = line[:200] + "..."
	}
	return line
}
