// Package slice owns the slice.topology_discover task handler of the node
// agent: an operator-onboarding scan of a GPU host that reports
// readiness prerequisites (KVM, IOMMU, CPU virtualisation, VFIO modules,
// required commands, slice network, pending reboot), the GPUs, Mellanox
// fabric adapters with their SR-IOV VFs and NVMe namespaces it found, and
// a proposal of candidate slots (GPU ↔ NVMe ↔ fabric VF on one NUMA node
// where possible, each with a deterministic MAC and private IP) with the
// blockers that keep them, or the host, from being schedulable.
//
// Discovery only reads: sysfs, procfs and devfs below injected roots, and
// PATH lookups through an injected function. It never writes, binds
// drivers, loads modules or runs commands, and every result carries
// approval_required: true — an operator turns candidates into slots. It
// must not import other Drover packages than internal/wire/api, internal/wire/task
// (for the params contract) and internal/node/hostinfo.
package slice

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/drover-dev/drover/internal/node/hostinfo"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TaskType is the task type this package handles.
const TaskType = task.TypeTopologyDiscover

// Phase names, in the order Discover runs them. Timings are keyed
// "<phase>_ms".
const (
	PhaseHost     = "host_checks"
	PhaseCommands = "commands"
	PhaseNetwork  = "network"
	PhasePCI      = "pci"
	PhaseNVMe     = "nvme"
	PhaseSlots    = "slots"
)

// Params are the task parameters (see task.TopologyDiscoverParams).
type Params = task.TopologyDiscoverParams

// ParamsError is returned by DecodeParams for unacceptable params.
type ParamsError struct{ Fields []api.FieldError }

func (e *ParamsError) Error() string {
	s := "slice: invalid params:"
	for _, f := range e.Fields {
		s += fmt.Sprintf(" %s: %s;", f.Field, f.Message)
	}
	return s[:len(s)-1]
}

// DecodeParams strictly decodes raw params with the control plane's rules
// and fills in defaults. Errors are *ParamsError.
func DecodeParams(raw json.RawMessage) (Params, error) {
	p, fe := task.DecodeTopologyDiscoverParams(raw)
	if fe != nil {
		return Params{}, &ParamsError{Fields: fe}
	}
	return p, nil
}

// Config tells a Discoverer where to look. Zero fields take the defaults.
type Config struct {
	SysRoot  string // default "/sys"
	ProcRoot string // default "/proc"
	DevRoot  string // default "/dev"
	// DevPath is how device paths are named in the result (nvme path and
	// by-id path): "/dev" (the default) names them as on the host; an
	// agent that reads a host tree below a root (agent.WithSliceHost)
	// names them where it opens them, DevRoot.
	DevPath string
	// RootDir is the filesystem root for marker files
	// (var/run/reboot-required), etc/netplan and the well-known pci.ids
	// locations; default "/".
	RootDir string
	// PCIIDsPath names a pci.ids file for GPU and adapter model names;
	// empty means $PCIDB_PATH, then the well-known locations.
	PCIIDsPath string
	Getenv     func(string) string // default os.Getenv
	// LookPath finds a command; default LookPath (PATH, then sbin dirs).
	LookPath func(file string) (string, error)
	// HostID seeds the slot MAC addresses; empty means Hostname's answer.
	HostID   string
	Hostname func() (string, error) // default os.Hostname
	GOOS     string                 // default runtime.GOOS; only linux is scanned
	GOARCH   string                 // default runtime.GOARCH; picks qemu-system-<arch>
	Now      func() time.Time       // timings clock; default time.Now
}

// Discoverer runs topology discovery. It is safe for concurrent use.
type Discoverer struct{ cfg Config }

// NewDiscoverer returns a Discoverer with cfg's defaults filled in.
func NewDiscoverer(cfg Config) *Discoverer {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&cfg.SysRoot, "/sys")
	def(&cfg.ProcRoot, "/proc")
	def(&cfg.DevRoot, "/dev")
	def(&cfg.RootDir, "/")
	def(&cfg.DevPath, "/dev")
	def(&cfg.GOOS, runtime.GOOS)
	def(&cfg.GOARCH, runtime.GOARCH)
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if cfg.LookPath == nil {
		cfg.LookPath = LookPath
	}
	if cfg.Hostname == nil {
		cfg.Hostname = os.Hostname
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Discoverer{cfg: cfg}
}

// LookPath is exec.LookPath, falling back to the sbin and local
// directories a service's restricted PATH may leave out.
func LookPath(file string) (string, error) {
	p, err := exec.LookPath(file)
	if err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		cand := filepath.Join(dir, file)
		if fi, serr := os.Stat(cand); serr == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return cand, nil
		}
	}
	return "", err
}

// scan holds what the phases found; it lives for one Discover call.
type scan struct {
	params  Params
	topo    Topology
	host    []Blocker // host-wide blockers, in check order
	notices []Blocker // informational findings, never blockers
	pci     []hostinfo.PCIDev
	byAddr  map[string]hostinfo.PCIDev
	mountOK bool
}

// Discover scans the host and proposes slots. progress (when non-nil) is
// called after each phase with its duration and the phase's error. A phase
// that cannot read what it needs fails the discovery; missing hardware or
// software are blockers in the result, not errors. Timings are keyed
// "<phase>_ms".
func (d *Discoverer) Discover(ctx context.Context, params Params, progress func(phase string, dur time.Duration, err error)) (Topology, map[string]int64, error) {
	params = params.WithDefaults()
	s := &scan{params: params, topo: Topology{
		ApprovalRequired: true,
		GPUDevices:       []GPUDevice{},
		FabricDevices:    []FabricDevice{},
		NVMeDevices:      []NVMeDevice{},
		CandidateSlots:   []CandidateSlot{},
	}}
	s.topo.HostID = d.hostID()
	s.topo.Prerequisites = Prerequisites{IOMMUKernelArgs: []string{}, LoadedModules: map[string]bool{},
		RequiredCommands: map[string]Command{},
		SliceNetwork: SliceNetwork{OVSBridge: params.OVSBridge, NAT: "unknown", PrivateCIDR: params.PrivateCIDR,
			IPoIBInterfaces: []IPoIBInterface{}}}
	timings := map[string]int64{}
	if d.cfg.GOOS != "linux" {
		s.host = append(s.host, Blocker{Code: BlockerUnsupportedOS,
			Message: "GPU slices need Linux with KVM and VFIO; this host runs " + d.cfg.GOOS})
		s.topo.CandidateSummary = summarize(s.host, nil, s.topo.CandidateSlots, nil)
		return s.topo, timings, nil
	}
	phases := []struct {
		name string
		fn   func(context.Context, *scan) error
	}{
		{PhaseHost, d.hostChecks},
		{PhaseCommands, d.commands},
		{PhaseNetwork, d.network},
		{PhasePCI, d.pciDevices},
		{PhaseNVMe, d.nvmeDevices},
		{PhaseSlots, d.slots},
	}
	for _, ph := range phases {
		if err := ctx.Err(); err != nil {
			return s.topo, timings, fmt.Errorf("slice: topology discovery interrupted before %s: %w", ph.name, err)
		}
		start := d.cfg.Now()
		err := ph.fn(ctx, s)
		dur := d.cfg.Now().Sub(start)
		timings[ph.name+"_ms"] = dur.Milliseconds()
		if progress != nil {
			progress(ph.name, dur, err)
		}
		if err != nil {
			return s.topo, timings, fmt.Errorf("slice: %s: %w", ph.name, err)
		}
	}
	return s.topo, timings, nil
}

func (d *Discoverer) hostID() string {
	if d.cfg.HostID != "" {
		return d.cfg.HostID
	}
	if h, err := d.cfg.Hostname(); err == nil {
		return h
	}
	return ""
}
