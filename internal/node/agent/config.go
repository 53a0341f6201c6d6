package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/hostinfo"
	"github.com/drover-dev/drover/internal/node/netsetup"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Config is the agent's configuration. It comes from, in increasing order of
// precedence: defaults, the env file (-env-file, KEY=VALUE lines), the config
// file (-config: TOML, YAML or JSON, or KEY=VALUE lines), NODE_AGENT_*
// environment variables and command-line flags (LoadConfig; the keys:
// docs/contract.md, the rules: docs/configuration.md).
type Config struct {
	ControlPlaneURL   string        // NODE_AGENT_CONTROL_PLANE_URL: node-facing mTLS URL, e.g. https://cp:8443
	TerminalURL       string        // NODE_AGENT_TERMINAL_URL: the terminal gateway's node-facing mTLS URL (LoadConfig defaults it to ControlPlaneURL)
	HostID            string        // NODE_AGENT_HOST_ID / -node-id: generated and persisted when empty
	BootstrapToken    string        // NODE_AGENT_BOOTSTRAP_TOKEN
	CAHash            string        // NODE_AGENT_CA_HASH: pin for first contact ("sha256:...")
	CAFile            string        // NODE_AGENT_CA_FILE: alternatively, a CA bundle to trust
	OSFamily          string        // NODE_AGENT_OS_FAMILY: linux | dragonflybsd | windows | darwin
	QEMUAccel         string        // NODE_AGENT_QEMU_ACCEL: kvm | nvmm | hvf | tcg
	AccelFallback     string        // NODE_AGENT_ACCEL_FALLBACK: "tcg" lets a host whose selected accelerator fails run VMs under TCG instead of refusing
	StateDir          string        // NODE_AGENT_STATE_DIR
	ListenAddr        string        // NODE_AGENT_LISTEN: local API, default 127.0.0.1:9000
	Hostname          string        // -hostname
	HeartbeatInterval time.Duration // -heartbeat-interval: 0 means the server's
	ReservedVCPUs     int           // NODE_AGENT_RESERVED_VCPUS: kept for the host OS
	ReservedMemoryMiB int           // NODE_AGENT_RESERVED_MEMORY_MIB
	// NODE_AGENT_DISK_PRESSURE_PERCENT: the state dir's filesystem usage
	// (percent) at which the agent reports node_observability_disk_pressure
	// and frees its own buffers (0 means DefaultDiskPressurePercent).
	DiskPressurePercent int
	// NODE_AGENT_TASK_SLOTS: how many tasks the agent runs at once, and so
	// the most one long-poll asks for (0 means DefaultTaskSlots; at most
	// MaxTaskSlots).
	TaskSlots int

	// Instances (VMs).
	Runtime          string // NODE_AGENT_RUNTIME: a name in Runtimes (LoadConfig's default: qemu) | none (also "")
	ContainerRuntime string // NODE_AGENT_CONTAINER_RUNTIME: a container runtime in Runtimes (docker) run beside Runtime | none (also "", the default)
	RuntimeDir       string // NODE_AGENT_RUNTIME_DIR: instances, overlays, image cache (default <state dir>/runtime)
	ImageDirs        string // NODE_AGENT_IMAGE_DIRS: comma-separated dirs local images and file:// URLs may come from (default /var/lib/drover/images)
	SecretsDir       string // NODE_AGENT_SECRETS_DIR: one file per secret an instance may name
	// NODE_AGENT_MICROVM_BRIDGE, NODE_AGENT_MICROVM_CIDR and
	// NODE_AGENT_MICROVM_DNS: the bridge microVM taps are enslaved to, the
	// per-host IPv4 CIDR they get their addresses from and the resolvers
	// (comma-separated IPv4 addresses) their guests are given (package
	// netsetup; LoadConfig's defaults are netsetup.DefaultBridge,
	// DefaultCIDR and DefaultDNS).
	MicroVMBridge string
	MicroVMCIDR   string
	MicroVMDNS    string
	// NODE_AGENT_SLICE_CIDR and NODE_AGENT_SLICE_BRIDGE: the slice network
	// of GPU slice VMs. With a CIDR, the agent makes the bridge (default
	// br-slice; an existing Open vSwitch bridge of that name is used as
	// it is) with the CIDR's first address, NAT for the CIDR (nftables
	// table drover_slice) and serves the slots' DHCP reservations on it
	// (package slicedhcp; guests get NODE_AGENT_MICROVM_DNS as resolvers).
	// Empty (the default), it serves none: the reservations are only
	// written, for a dnsmasq the operator runs.
	SliceCIDR   string
	SliceBridge string
	// NODE_AGENT_HOST_ROOT: the host's root filesystem as this agent sees
	// it (default "/"). The hardware inventory and the slice tasks
	// (slice.topology_discover, slice.vm_provision, slice.vm_release) read
	// sys/, proc/, dev/ and etc/ below it, slot NVMe devices are opened
	// below its dev/, and the QEMU runtime takes boot devices from there:
	// an agent run in a container with the host's / mounted at /host
	// sets /host (node_exporter's --path.rootfs).
	HostRoot string
	// NODE_AGENT_SLICE_INSTALL_DEPENDENCIES: slice.vm_provision's
	// host_dependencies phase installs the pinned packages that provide
	// missing commands (slicevm.DependencyPackages, with apt-get or dnf
	// per /etc/os-release, bounded by slicevm.DefaultInstallTimeout);
	// default false: a missing command is only a blocker.
	SliceInstallDependencies bool
	// NODE_AGENT_SLICE_TELEMETRY_INTERVAL: how often the agent collects
	// slice guests' telemetry over the brokered SSH channel (default 30s,
	// at least 5s).
	SliceTelemetryInterval time.Duration
	ReconcileInterval      time.Duration // NODE_AGENT_RECONCILE_INTERVAL: resync period (default 5s)
	// The restart policy of instances that exit, crash or fail their
	// health checks (package reconcile): NODE_AGENT_RESTART_BACKOFF (the
	// first wait, doubling per restart; default 1s),
	// NODE_AGENT_RESTART_BACKOFF_MAX (default 5m) and
	// NODE_AGENT_CRASH_LOOP_THRESHOLD (restarts within 10 minutes after
	// which the reason is crash_loop_backoff; default 5). 0 takes the
	// default.
	RestartBackoff     time.Duration
	RestartBackoffMax  time.Duration
	CrashLoopThreshold int

	// NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS: let http(s) image URLs point at
	// loopback, link-local (cloud metadata) and unspecified addresses
	// (default false: refused; for rigs serving images on 127.0.0.1).
	ImageAllowLocalURLs bool
	// NODE_AGENT_OCI_CACHE_MAX_GIB: the OCI image cache's bound (layer
	// blobs plus root filesystems under <runtime dir>/oci), past which the
	// least recently used images no instance holds are evicted (0 means
	// DefaultOCICacheMaxGiB).
	OCICacheMaxGiB int

	// Runtimes are the runtimes this binary links in, by name; Runtime
	// must be one of them or none. The binary builds it (drover-agent:
	// qemu; `drover dev`: qemu and mock), LoadConfig sets it.
	Runtimes noderuntime.Registry
	// RuntimeSettings are the keys the registered runtimes own, by key
	// (NODE_AGENT_QEMU_BINARY, ...: each entry's Settings); unset ones
	// take the runtime's default.
	RuntimeSettings map[string]string

	// Local are the inference servers seed 003's flags declare
	// (-enable-vllm, -enable-ollama and their settings).
	Local LocalWorkloads
}

// DefaultRuntime is NODE_AGENT_RUNTIME when nothing sets it.
const DefaultRuntime = "qemu"

// RuntimeNone runs no instances on this host. It is built in: no
// registry entry names it.
const RuntimeNone = "none"

// DefaultImageDir is where local images may live when NODE_AGENT_IMAGE_DIRS
// is unset: local image paths are confined to these directories.
const DefaultImageDir = "/var/lib/drover/images"

func defaultStateDir() string {
	if runtime.GOOS == "windows" {
		return `C:\ProgramData\drover-agent`
	}
	return "/var/lib/drover-agent"
}

// envKeys maps configuration keys to fields.
func (c *Config) fields() map[string]*string {
	m := map[string]*string{
		"NODE_AGENT_CONTROL_PLANE_URL": &c.ControlPlaneURL,
		"NODE_AGENT_TERMINAL_URL":      &c.TerminalURL,
		"NODE_AGENT_HOST_ID":           &c.HostID,
		"NODE_AGENT_BOOTSTRAP_TOKEN":   &c.BootstrapToken,
		"NODE_AGENT_CA_HASH":           &c.CAHash,
		"NODE_AGENT_CA_FILE":           &c.CAFile,
		"NODE_AGENT_OS_FAMILY":         &c.OSFamily,
		"NODE_AGENT_QEMU_ACCEL":        &c.QEMUAccel,
		"NODE_AGENT_STATE_DIR":         &c.StateDir,
		"NODE_AGENT_LISTEN":            &c.ListenAddr,
		"NODE_AGENT_HOSTNAME":          &c.Hostname,
		"NODE_AGENT_ACCEL_FALLBACK":    &c.AccelFallback,
		"NODE_AGENT_RUNTIME":           &c.Runtime,
		"NODE_AGENT_CONTAINER_RUNTIME": &c.ContainerRuntime,
		"NODE_AGENT_RUNTIME_DIR":       &c.RuntimeDir,
		"NODE_AGENT_IMAGE_DIRS":        &c.ImageDirs,
		"NODE_AGENT_SECRETS_DIR":       &c.SecretsDir,
		"NODE_AGENT_MICROVM_BRIDGE":    &c.MicroVMBridge,
		"NODE_AGENT_MICROVM_CIDR":      &c.MicroVMCIDR,
		"NODE_AGENT_MICROVM_DNS":       &c.MicroVMDNS,
		"NODE_AGENT_SLICE_CIDR":        &c.SliceCIDR,
		"NODE_AGENT_SLICE_BRIDGE":      &c.SliceBridge,
		"NODE_AGENT_HOST_ROOT":         &c.HostRoot,
	}
	for k, p := range c.presetStringKeys() {
		m[k] = p
	}
	return m
}

// LoadConfig builds the configuration from args (without the program name),
// the environment lookup function, the env file and the config file. Each
// key comes from, highest first: a flag, its NODE_AGENT_* environment
// variable, the -config file, the env file (-env-file, by default
// DefaultEnvFile), the default (docs/configuration.md). NODE_AGENT_RUNTIME
// may name any runtime in runtimes, or none.
func LoadConfig(args []string, getenv func(string) string, runtimes noderuntime.Registry, opts ...LoadOption) (Config, error) {
	l, err := load(args, getenv, runtimes, opts)
	if err != nil {
		return Config{}, err
	}
	return l.cfg, l.validate()
}

// flagMeta are the flags that set no key of their own: where the
// configuration comes from, and -orchestrator (an alias with a rewrite).
type flagMeta struct {
	config, envFile, orchestrator *string
}

// newFlagSet defines the agent's flags, each setting its field of f, the
// meta flags (-config, whose default is configDefault, -env-file, whose
// default is envFileDefault, -orchestrator), and the flags of the settings
// the runtimes own.
func newFlagSet(f *Config, configDefault, envFileDefault string, runtimes noderuntime.Registry) (*flag.FlagSet, flagMeta) {
	fs := flag.NewFlagSet("drover-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var m flagMeta
	m.config = fs.String("config", configDefault, "config file: .toml, .yaml/.yml or .json (keys: docs/configuration.md), else KEY=VALUE lines with NODE_AGENT_* keys")
	m.envFile = fs.String("env-file", envFileDefault, `env file of NODE_AGENT_*=VALUE lines (absent default is fine; "" reads none)`)
	m.orchestrator = fs.String("orchestrator", "", "alias of -control-plane-url: host:port means https://host:port")
	fs.StringVar(&f.ControlPlaneURL, "control-plane-url", "", "node-facing control plane URL (https://host:8443)")
	fs.StringVar(&f.TerminalURL, "terminal-url", "", "terminal gateway's node-facing URL (default: the control plane URL)")
	fs.StringVar(&f.HostID, "host-id", "", "host id of this node's host record")
	fs.StringVar(&f.HostID, "node-id", "", "alias of -host-id")
	fs.StringVar(&f.BootstrapToken, "bootstrap-token", "", "one-time bootstrap token")
	fs.StringVar(&f.CAHash, "ca-hash", "", "pinned control plane CA hash (sha256:...)")
	fs.StringVar(&f.CAFile, "ca-file", "", "control plane CA bundle (instead of -ca-hash)")
	fs.StringVar(&f.OSFamily, "os-family", "", "linux | dragonflybsd | windows | darwin")
	fs.StringVar(&f.QEMUAccel, "qemu-accel", "", "kvm | nvmm | hvf | tcg")
	fs.StringVar(&f.StateDir, "state-dir", "", "directory for identity, spool and replay cache")
	fs.StringVar(&f.ListenAddr, "listen", "", "local API address (default 127.0.0.1:9000)")
	fs.StringVar(&f.Hostname, "hostname", "", "hostname to report (default: the system's)")
	fs.DurationVar(&f.HeartbeatInterval, "heartbeat-interval", 0, "heartbeat interval (default: the server's, 5s)")
	fs.IntVar(&f.ReservedVCPUs, "reserved-vcpus", 0, "vCPUs reserved for the host OS")
	fs.IntVar(&f.ReservedMemoryMiB, "reserved-memory-mib", 0, "memory reserved for the host OS, MiB")
	fs.IntVar(&f.DiskPressurePercent, "disk-pressure-percent", 0, "state dir filesystem usage (percent) reported as disk pressure")
	fs.IntVar(&f.TaskSlots, "task-slots", 0, "tasks run at once; each long-poll asks for as many as are free (default 4, at most 64)")
	fs.StringVar(&f.AccelFallback, "accel-fallback", "", `"tcg": run VMs under TCG when the selected accelerator does not work`)
	fs.StringVar(&f.Runtime, "runtime", "", "instance runtime: one this binary registers, or none")
	fs.StringVar(&f.ContainerRuntime, "container-runtime", "", "container runtime run beside -runtime (docker), or none")
	fs.StringVar(&f.RuntimeDir, "runtime-dir", "", "instances, overlays and image cache (default <state dir>/runtime)")
	fs.StringVar(&f.ImageDirs, "image-dirs", "", "comma-separated dirs local images may come from")
	fs.BoolVar(&f.ImageAllowLocalURLs, "image-allow-local-urls", false,
		"let http(s) image URLs point at loopback, link-local (cloud metadata) and unspecified addresses (default false)")
	fs.IntVar(&f.OCICacheMaxGiB, "oci-cache-max-gib", 0, "OCI image cache bound (layers and root filesystems), GiB; least recently used images no instance holds are evicted past it")
	fs.StringVar(&f.SecretsDir, "secrets-dir", "", "directory with one file per instance secret")
	fs.StringVar(&f.MicroVMBridge, "microvm-bridge", "", "bridge microVM taps are enslaved to, created if missing (default drbr0)")
	fs.StringVar(&f.MicroVMCIDR, "microvm-cidr", "", "per-host IPv4 CIDR microVMs get addresses from; its first address is the gateway on the bridge (default 10.88.0.0/24)")
	fs.StringVar(&f.MicroVMDNS, "microvm-dns", "", "comma-separated IPv4 resolvers microVM guests are given in /etc/resolv.conf (default 1.1.1.1)")
	fs.StringVar(&f.SliceCIDR, "slice-cidr", "", "IPv4 CIDR of the slice network: the agent makes -slice-bridge with its first address, NAT, and serves slice VMs' DHCP reservations on it (default none: reservations are only written)")
	fs.StringVar(&f.SliceBridge, "slice-bridge", "", "bridge of the slice network, created as a Linux bridge if missing; an existing Open vSwitch bridge is used as it is (default br-slice)")
	fs.StringVar(&f.HostRoot, "host-root", "", "the host's / as this agent sees it: inventory and slice tasks read sys/, proc/, dev/ and etc/ below it (default /; /host for an agent in a container)")
	fs.BoolVar(&f.SliceInstallDependencies, "slice-install-dependencies", false,
		"let slice.vm_provision install the pinned packages providing missing host commands with apt-get or dnf (default false: only report them)")
	fs.DurationVar(&f.SliceTelemetryInterval, "slice-telemetry-interval", 0, "how often slice guests' telemetry is collected over SSH (default 30s)")
	fs.DurationVar(&f.ReconcileInterval, "reconcile-interval", 0, "instance resync period (default 5s)")
	fs.DurationVar(&f.RestartBackoff, "restart-backoff", 0, "first wait before an exited or unhealthy instance restarts, doubling per restart (default 1s)")
	fs.DurationVar(&f.RestartBackoffMax, "restart-backoff-max", 0, "longest wait between restarts (default 5m)")
	fs.IntVar(&f.CrashLoopThreshold, "crash-loop-threshold", 0, "restarts within 10 minutes after which an instance's reason is crash_loop_backoff (default 5)")
	definePresetFlags(fs, f)
	for _, name := range runtimes.Names() {
		for _, st := range runtimes[name].Settings {
			fs.String(noderuntime.FlagName(name, st.Name), "", st.Usage)
		}
	}
	return fs, m
}

// terminalURL is where terminal streams are dialed: TerminalURL, or the
// control plane URL when it is unset (a Config built by hand).
func (c Config) terminalURL() string {
	if c.TerminalURL != "" {
		return c.TerminalURL
	}
	return c.ControlPlaneURL
}

// numericKeys are the configuration keys that are not plain strings
// (durations, counts, booleans).
func numericKeys() []string {
	return append([]string{"NODE_AGENT_HEARTBEAT_INTERVAL", "NODE_AGENT_RESERVED_VCPUS",
		"NODE_AGENT_RESERVED_MEMORY_MIB", "NODE_AGENT_RECONCILE_INTERVAL", "NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS",
		"NODE_AGENT_DISK_PRESSURE_PERCENT", "NODE_AGENT_OCI_CACHE_MAX_GIB", "NODE_AGENT_RESTART_BACKOFF",
		"NODE_AGENT_RESTART_BACKOFF_MAX", "NODE_AGENT_CRASH_LOOP_THRESHOLD", "NODE_AGENT_SLICE_INSTALL_DEPENDENCIES",
		"NODE_AGENT_SLICE_TELEMETRY_INTERVAL", "NODE_AGENT_TASK_SLOTS"}, presetNumericKeys()...)
}

// setNumeric sets one of the non-string keys.
func (c *Config) setNumeric(key, val string) error {
	if ok, err := c.setPresetKey(key, val); ok {
		return err
	}
	if key == "NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS" || key == "NODE_AGENT_SLICE_INSTALL_DEPENDENCIES" {
		b, err := strconv.ParseBool(val)
		if err != nil {
			return fmt.Errorf("%s %q: must be true or false", key, val)
		}
		if key == "NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS" {
			c.ImageAllowLocalURLs = b
		} else {
			c.SliceInstallDependencies = b
		}
		return nil
	}
	if dst := c.durationField(key); dst != nil {
		d, err := time.ParseDuration(val)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		*dst = d
		return nil
	}
	n, err := strconv.Atoi(val)
	if err != nil || n < 0 {
		return fmt.Errorf("%s %q: must be a whole number >= 0", key, val)
	}
	switch key {
	case "NODE_AGENT_DISK_PRESSURE_PERCENT":
		if n < 1 || n > 100 {
			return fmt.Errorf("%s %q: must be a percentage between 1 and 100", key, val)
		}
		c.DiskPressurePercent = n
	case "NODE_AGENT_RESERVED_VCPUS":
		c.ReservedVCPUs = n
	case "NODE_AGENT_OCI_CACHE_MAX_GIB":
		c.OCICacheMaxGiB = n
	case "NODE_AGENT_CRASH_LOOP_THRESHOLD":
		c.CrashLoopThreshold = n
	case "NODE_AGENT_TASK_SLOTS":
		c.TaskSlots = n
	default:
		c.ReservedMemoryMiB = n
	}
	return nil
}

// durationField is the field of a duration key, nil for other keys.
func (c *Config) durationField(key string) *time.Duration {
	switch key {
	case "NODE_AGENT_HEARTBEAT_INTERVAL":
		return &c.HeartbeatInterval
	case "NODE_AGENT_RECONCILE_INTERVAL":
		return &c.ReconcileInterval
	case "NODE_AGENT_RESTART_BACKOFF":
		return &c.RestartBackoff
	case "NODE_AGENT_RESTART_BACKOFF_MAX":
		return &c.RestartBackoffMax
	case "NODE_AGENT_SLICE_TELEMETRY_INTERVAL":
		return &c.SliceTelemetryInterval
	}
	return nil
}

// DefaultSliceTelemetryInterval is NODE_AGENT_SLICE_TELEMETRY_INTERVAL's
// default.
const DefaultSliceTelemetryInterval = 30 * time.Second

func (c Config) sliceTelemetryInterval() time.Duration {
	if c.SliceTelemetryInterval <= 0 {
		return DefaultSliceTelemetryInterval
	}
	return c.SliceTelemetryInterval
}

// DefaultOCICacheMaxGiB is NODE_AGENT_OCI_CACHE_MAX_GIB's default.
const DefaultOCICacheMaxGiB = 20

// OCICacheMaxBytes is the OCI image cache's bound, with its default.
func (c Config) OCICacheMaxBytes() int64 {
	if c.OCICacheMaxGiB <= 0 {
		return DefaultOCICacheMaxGiB << 30
	}
	return int64(c.OCICacheMaxGiB) << 30
}

// DefaultTaskSlots is NODE_AGENT_TASK_SLOTS's default, and MaxTaskSlots its
// bound.
const (
	DefaultTaskSlots = 4
	MaxTaskSlots     = 64
)

// taskSlots is how many tasks run at once, with its default.
func (c Config) taskSlots() int {
	if c.TaskSlots <= 0 {
		return DefaultTaskSlots
	}
	return min(c.TaskSlots, MaxTaskSlots)
}

// DefaultDiskPressurePercent is NODE_AGENT_DISK_PRESSURE_PERCENT's default.
const DefaultDiskPressurePercent = 90

// diskPressurePercent is the disk pressure threshold, with its default.
func (c Config) diskPressurePercent() int {
	if c.DiskPressurePercent <= 0 {
		return DefaultDiskPressurePercent
	}
	return min(c.DiskPressurePercent, 100)
}

// Validate names every invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.ControlPlaneURL == "" {
		errs = append(errs, errors.New("NODE_AGENT_CONTROL_PLANE_URL (-control-plane-url) is required"))
	} else if u, err := url.Parse(c.ControlPlaneURL); err != nil || u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("NODE_AGENT_CONTROL_PLANE_URL %q: must be an https:// URL of the node-facing listener", c.ControlPlaneURL))
	}
	if c.TerminalURL != "" {
		if u, err := url.Parse(c.TerminalURL); err != nil || u.Scheme != "https" || u.Host == "" {
			errs = append(errs, fmt.Errorf("NODE_AGENT_TERMINAL_URL %q: must be an https:// URL of the terminal gateway's node-facing listener", c.TerminalURL))
		}
	}
	if !api.ValidOSFamily(c.OSFamily) {
		errs = append(errs, fmt.Errorf("NODE_AGENT_OS_FAMILY %q: must be linux, dragonflybsd, windows or darwin", c.OSFamily))
	}
	if c.HostID != "" {
		if err := api.ValidHostID(c.HostID); err != nil {
			errs = append(errs, fmt.Errorf("NODE_AGENT_HOST_ID: %w", err))
		}
	}
	if c.HeartbeatInterval < 0 || (c.HeartbeatInterval > 0 && c.HeartbeatInterval < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("-heartbeat-interval %s: must be at least 100ms", c.HeartbeatInterval))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("NODE_AGENT_STATE_DIR is required"))
	}
	if c.TaskSlots < 0 || c.TaskSlots > MaxTaskSlots {
		errs = append(errs, fmt.Errorf("NODE_AGENT_TASK_SLOTS %d: must be between 1 and %d (0 takes the default, %d)", c.TaskSlots, MaxTaskSlots, DefaultTaskSlots))
	}
	if c.AccelFallback != "" && c.AccelFallback != "tcg" {
		errs = append(errs, fmt.Errorf("NODE_AGENT_ACCEL_FALLBACK %q: must be tcg or empty", c.AccelFallback))
	}
	if _, ok := c.Runtimes[c.Runtime]; !ok && c.Runtime != RuntimeNone && c.Runtime != "" {
		errs = append(errs, fmt.Errorf("NODE_AGENT_RUNTIME %q: must be one of %s (the runtimes this binary has)",
			c.Runtime, strings.Join(c.runtimeNames(), ", ")))
	}
	if e, ok := c.Runtimes[c.Runtime]; ok {
		if err := e.Check(c.runtimeValues(c.Runtime)); err != nil {
			errs = append(errs, fmt.Errorf("NODE_AGENT_RUNTIME %s: %w", c.Runtime, err))
		}
	}
	if cr := c.ContainerRuntime; cr != "" && cr != RuntimeNone {
		if e, ok := c.Runtimes[cr]; !ok || cr == c.Runtime {
			errs = append(errs, fmt.Errorf("NODE_AGENT_CONTAINER_RUNTIME %q: must be none or a runtime this binary has other than NODE_AGENT_RUNTIME (%s)",
				cr, strings.Join(c.Runtimes.Names(), ", ")))
		} else if err := e.Check(c.runtimeValues(cr)); err != nil {
			errs = append(errs, fmt.Errorf("NODE_AGENT_CONTAINER_RUNTIME %s: %w", cr, err))
		}
	}
	for _, e := range []struct {
		key string
		cfg netsetup.Config
	}{{"NODE_AGENT_MICROVM_BRIDGE", netsetup.Config{Bridge: c.MicroVMBridge}},
		{"NODE_AGENT_MICROVM_CIDR", netsetup.Config{CIDR: c.MicroVMCIDR}},
		{"NODE_AGENT_MICROVM_DNS", netsetup.Config{DNS: c.microVMDNS()}},
		{"NODE_AGENT_SLICE_CIDR", netsetup.Config{CIDR: c.SliceCIDR}},
		{"NODE_AGENT_SLICE_BRIDGE", netsetup.Config{Bridge: c.SliceBridge}}} {
		if err := e.cfg.Check(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.key, err))
		}
	}
	if c.HostRoot != "" && !filepath.IsAbs(c.HostRoot) {
		errs = append(errs, fmt.Errorf("NODE_AGENT_HOST_ROOT %q: must be an absolute path", c.HostRoot))
	}
	for _, d := range c.imageDirs() {
		if !filepath.IsAbs(d) {
			errs = append(errs, fmt.Errorf("NODE_AGENT_IMAGE_DIRS: %q is not an absolute path", d))
		}
	}
	if c.DiskPressurePercent < 0 || c.DiskPressurePercent > 100 {
		errs = append(errs, fmt.Errorf("NODE_AGENT_DISK_PRESSURE_PERCENT %d: must be between 1 and 100", c.DiskPressurePercent))
	}
	if c.SliceTelemetryInterval < 0 || (c.SliceTelemetryInterval > 0 && c.SliceTelemetryInterval < 5*time.Second) {
		errs = append(errs, fmt.Errorf("NODE_AGENT_SLICE_TELEMETRY_INTERVAL %s: must be at least 5s", c.SliceTelemetryInterval))
	}
	if c.ReconcileInterval < 0 || (c.ReconcileInterval > 0 && c.ReconcileInterval < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("NODE_AGENT_RECONCILE_INTERVAL %s: must be at least 100ms", c.ReconcileInterval))
	}
	if c.RestartBackoff < 0 || (c.RestartBackoff > 0 && c.RestartBackoff < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("NODE_AGENT_RESTART_BACKOFF %s: must be at least 100ms", c.RestartBackoff))
	}
	if c.RestartBackoffMax < 0 || (c.RestartBackoffMax > 0 && c.RestartBackoffMax < max(c.RestartBackoff, 100*time.Millisecond)) {
		errs = append(errs, fmt.Errorf("NODE_AGENT_RESTART_BACKOFF_MAX %s: must be at least NODE_AGENT_RESTART_BACKOFF and 100ms", c.RestartBackoffMax))
	}
	errs = append(errs, c.validateLocal()...)
	return errors.Join(errs...)
}

// runtimeNames are the values NODE_AGENT_RUNTIME may take: the registered
// runtimes, then none.
func (c Config) runtimeNames() []string {
	return append(c.Runtimes.Names(), RuntimeNone)
}

// microVMDNS splits MicroVMDNS (comma-separated; nil: netsetup's default).
func (c Config) microVMDNS() []string {
	var out []string
	for _, d := range strings.Split(c.MicroVMDNS, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// imageDirs splits ImageDirs (comma-separated).
func (c Config) imageDirs() []string {
	var out []string
	for _, d := range strings.Split(c.ImageDirs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// runtimeSetting is one key a registered runtime owns.
type runtimeSetting struct {
	runtime string
	setting noderuntime.Setting
}

// runtimeKeys maps the keys of every registered runtime's settings
// (NODE_AGENT_QEMU_BINARY, ...) to their runtime and setting.
func (c Config) runtimeKeys() map[string]runtimeSetting {
	out := map[string]runtimeSetting{}
	for name, e := range c.Runtimes {
		for _, st := range e.Settings {
			out[noderuntime.EnvKey(name, st.Name)] = runtimeSetting{name, st}
		}
	}
	return out
}

// setRuntimeKey sets one key a runtime owns.
func (c *Config) setRuntimeKey(key, val string) {
	if c.RuntimeSettings == nil {
		c.RuntimeSettings = map[string]string{}
	}
	c.RuntimeSettings[key] = val
}

// runtimeValues are the settings of the runtime name, by setting name, as
// its entry parses them (unset ones take the runtime's default there).
func (c Config) runtimeValues(name string) noderuntime.Values {
	v := noderuntime.Values{}
	for _, st := range c.Runtimes[name].Settings {
		if x, ok := c.RuntimeSettings[noderuntime.EnvKey(name, st.Name)]; ok {
			v[st.Name] = x
		}
	}
	return v
}

// hostRoot is NODE_AGENT_HOST_ROOT, cleaned; "" when it is the real root.
func (c Config) hostRoot() string {
	if c.HostRoot == "" || filepath.Clean(c.HostRoot) == "/" {
		return ""
	}
	return filepath.Clean(c.HostRoot)
}

// inventoryConfig points the hardware inventory at NODE_AGENT_HOST_ROOT.
func (c Config) inventoryConfig() hostinfo.Config {
	r := c.hostRoot()
	if r == "" {
		return hostinfo.Config{}
	}
	return hostinfo.Config{SysRoot: filepath.Join(r, "sys"), ProcRoot: filepath.Join(r, "proc"),
		DevRoot: filepath.Join(r, "dev"), EtcRoot: filepath.Join(r, "etc")}
}
