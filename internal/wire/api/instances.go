package api

import (
	"slices"
	"time"

	"github.com/drover-dev/drover/internal/wire/pattern"
)

var runtimeIDRE = pattern.Must(`^[a-z0-9][a-z0-9_-]{0,62}$`, `^[a-z0-9][a-z0-9_-]*$`, 1, 63)

// ValidRuntimeID reports whether id may name an instance or VM on a node:
// 1-63 of [a-z0-9_-], starting with a letter or digit.
func ValidRuntimeID(id string) bool { return runtimeIDRE.MatchString(id) }

// InstancePhase is an instance's status (docs/contract.md), a state machine:
// Pending → Booting → Ready → Draining → Stopped, or Failed with a reason.
type InstancePhase string

// Instance phases.
const (
	InstancePending  InstancePhase = "Pending"
	InstanceBooting  InstancePhase = "Booting"
	InstanceReady    InstancePhase = "Ready"
	InstanceDraining InstancePhase = "Draining"
	InstanceStopped  InstancePhase = "Stopped"
	InstanceFailed   InstancePhase = "Failed"
)

// ValidInstancePhase reports whether p is one of the phases above.
func ValidInstancePhase(p InstancePhase) bool {
	switch p {
	case InstancePending, InstanceBooting, InstanceReady, InstanceDraining, InstanceStopped, InstanceFailed:
		return true
	}
	return false
}

// ReasonCode says why an instance failed or stopped (docs/contract.md).
type ReasonCode string

// Reason codes. VMStartFailed is the QEMU runtime's start failure
// (firecracker_start_failed names the Firecracker one,
// container_start_failed the container runtime's).
const (
	ReasonImagePullFailed        ReasonCode = "image_pull_failed"
	ReasonRootfsBuildFailed      ReasonCode = "rootfs_build_failed"
	ReasonFirecrackerStartFailed ReasonCode = "firecracker_start_failed"
	ReasonVMStartFailed          ReasonCode = "vm_start_failed"
	ReasonContainerStartFailed   ReasonCode = "container_start_failed"
	ReasonNetworkSetupFailed     ReasonCode = "network_setup_failed"
	ReasonVolumeAttachFailed     ReasonCode = "volume_attach_failed"
	ReasonSecretsMissing         ReasonCode = "secrets_missing"
	ReasonSecretsInjectionFailed ReasonCode = "secrets_injection_failed"
	ReasonHealthcheckFailed      ReasonCode = "healthcheck_failed"
	ReasonOOMKilled              ReasonCode = "oom_killed"
	ReasonCrashLoopBackoff       ReasonCode = "crash_loop_backoff"
	ReasonTerminatedByOperator   ReasonCode = "terminated_by_operator"
	ReasonNodeDraining           ReasonCode = "node_draining"
)

// ReasonCodes lists every reason code (for validation and docs).
func ReasonCodes() []ReasonCode {
	return []ReasonCode{
		ReasonImagePullFailed, ReasonRootfsBuildFailed, ReasonFirecrackerStartFailed,
		ReasonVMStartFailed, ReasonContainerStartFailed, ReasonNetworkSetupFailed, ReasonVolumeAttachFailed,
		ReasonSecretsMissing, ReasonSecretsInjectionFailed, ReasonHealthcheckFailed,
		ReasonOOMKilled, ReasonCrashLoopBackoff, ReasonTerminatedByOperator, ReasonNodeDraining,
	}
}

// ValidReasonCode reports whether c is a known reason code ("" is not).
func ValidReasonCode(c ReasonCode) bool {
	for _, k := range ReasonCodes() {
		if c == k {
			return true
		}
	}
	return false
}

// DesiredState is what the operator wants of an instance.
type DesiredState string

// Desired states. Deleted means stop, destroy, then forget the record.
const (
	DesiredRunning DesiredState = "running"
	DesiredStopped DesiredState = "stopped"
	DesiredDeleted DesiredState = "deleted"
)

// Artifact is a file the agent fetches into its content-addressed image
// cache: URL is http, https or file (file only under the agent's image
// directories); SHA256 is the lowercase hex digest it must match.
type Artifact struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
}

// DirectBoot boots a kernel and initrd directly instead of the disk's
// bootloader (small guests, tests).
type DirectBoot struct {
	Kernel  Artifact  `json:"kernel"`
	Initrd  *Artifact `json:"initrd,omitempty"`
	Cmdline string    `json:"cmdline,omitempty"`
}

// PortForward forwards a host port on 127.0.0.1 to a guest TCP port
// (user-mode networking). HostPort 0 lets the agent pick a free port.
type PortForward struct {
	Name      string `json:"name"`
	GuestPort int    `json:"guest_port"`
	HostPort  int    `json:"host_port,omitempty"`
}

// Network modes.
const (
	NetworkUser = "user" // QEMU user-mode networking with host port forwards (default)
	NetworkTap  = "tap"  // a tap device enslaved to Bridge
	// NetworkBridge (runtime microvm): a tap on the agent's own bridge
	// (NODE_AGENT_MICROVM_BRIDGE) with an address from its CIDR
	// (NODE_AGENT_MICROVM_CIDR), NAT out and Forwards as host DNAT rules.
	NetworkBridge = "bridge"
)

// NetworkSpec is an instance's network.
type NetworkSpec struct {
	Mode     string        `json:"mode,omitempty"` // "user" (default), "tap" or "bridge" (microVMs)
	Forwards []PortForward `json:"forwards,omitempty"`
	Bridge   string        `json:"bridge,omitempty"` // tap mode only
	MAC      string        `json:"mac,omitempty"`
}

// CloudInit is the NoCloud seed the agent builds for the guest.
type CloudInit struct {
	Hostname          string   `json:"hostname,omitempty"`
	User              string   `json:"user,omitempty"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
}

// Readiness says when a booted instance is Ready: when SerialMarker appears
// on its serial console, or when GuestPort accepts TCP connections (through
// its forward), or both. With neither, Ready means "process running".
//
// HTTPPath (containers) makes readiness an HTTP GET of that path on TCPPort
// answering 2xx or 3xx, instead of a bare TCP connect.
type Readiness struct {
	SerialMarker string   `json:"serial_marker,omitempty"`
	TCPPort      int      `json:"tcp_port,omitempty"`
	HTTPPath     string   `json:"http_path,omitempty"`
	Timeout      Duration `json:"timeout,omitempty"` // default 5m
}

// HealthCheck configures periodic checks after Ready. FailureThreshold
// consecutive failures make the instance Failed (healthcheck_failed).
type HealthCheck struct {
	Interval         Duration `json:"interval,omitempty"`          // default 10s
	FailureThreshold int      `json:"failure_threshold,omitempty"` // default 3
}

// Instance runtimes (InstanceSpec.Runtime, Capabilities.Runtimes).
const (
	RuntimeQEMU   = "qemu"
	RuntimeDocker = "docker" // containers through the Docker Engine API (Docker or Podman)
	// RuntimeMicroVM boots an OCI image (Container.Image) or a raw ext4
	// root filesystem (Image, with Container.Command) as a microVM: the
	// QEMU runtime's microVM mode, drover-init as PID 1.
	RuntimeMicroVM = "microvm"
)

// GPUsAll in ContainerSpec.GPUs gives the container every GPU of the host.
const GPUsAll = "all"

// ContainerSpec is what a container instance runs (InstanceSpec.Runtime
// "docker"). Its ports are InstanceSpec.Network.Forwards (GuestPort is the
// container port; bound on the host's 127.0.0.1), its readiness
// InstanceSpec.Readiness (TCPPort, with HTTPPath for an HTTP check), its
// secrets InstanceSpec.Secrets (files under /run/drover/secrets), and a
// stop sends the image's stop signal, then SIGKILL after GracefulTimeout.
type ContainerSpec struct {
	// Image is an OCI image reference (registry/repo:tag); Digest
	// ("sha256:<64 hex>"), when set, is what the pulled image must be.
	Image   string            `json:"image"`
	Digest  string            `json:"digest,omitempty"`
	Command []string          `json:"command,omitempty"` // replaces the image's entrypoint
	Args    []string          `json:"args,omitempty"`    // replaces the image's command
	Env     map[string]string `json:"env,omitempty"`
	Volumes []VolumeMount     `json:"volumes,omitempty"`
	// GPUs by index ("0") or UUID ("GPU-…") of the host's discovered GPUs,
	// or ["all"].
	GPUs    []string `json:"gpus,omitempty"`
	Ulimits *Ulimits `json:"ulimits,omitempty"`
	// RegistryAuth names a secret holding the registry credentials for the
	// pull, as a Docker config ({"username":…,"password":…}).
	RegistryAuth string `json:"registry_auth,omitempty"`
	// ShmSizeMiB sizes /dev/shm (0: the engine's default, 64 MiB); vLLM's
	// tensor-parallel workers share tensors through it.
	ShmSizeMiB int `json:"shm_size_mib,omitempty"`
}

// VolumeMount mounts a named volume (kept when the instance is deleted) or
// a host path (an absolute path under the agent's allowed volume
// directories) at Target.
//
// A microVM's Source is a volume name (ValidVolumeName) only: the host
// creates the volume on first use with SizeGiB (0: DefaultVolumeSizeGiB)
// and Format ("": raw), attaches it as an extra virtio disk and mounts it
// at Target. An existing volume is used as it is: a SizeGiB larger than
// its size, or a Format other than its own, is volume_attach_failed
// (volumes are neither grown nor converted). SizeGiB and Format are
// microVM-only: a container's spec with either is refused (its named
// volumes are the engine's).
type VolumeMount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
	SizeGiB  int    `json:"size_gib,omitempty"`
	Format   string `json:"format,omitempty"`
}

// Ulimits are a container's limits (soft = hard); 0 takes the agent's
// default (NODE_AGENT_DOCKER_ULIMIT_NOFILE, ..._NPROC).
type Ulimits struct {
	NoFile int64 `json:"nofile,omitempty"`
	NProc  int64 `json:"nproc,omitempty"`
}

// InstanceSpec is what an instance runs: a VM (Runtime "", the host's VM
// runtime) from Image, or a container (Runtime "docker") from Container.
type InstanceSpec struct {
	// Runtime picks the host's runtime: "" its VM runtime, "docker"
	// containers. Placement considers only hosts reporting it.
	Runtime     string         `json:"runtime,omitempty"`
	Container   *ContainerSpec `json:"container,omitempty"`
	Image       Artifact       `json:"image"`
	Boot        *DirectBoot    `json:"boot,omitempty"`
	VCPUs       int            `json:"vcpus"`
	MemoryMiB   int            `json:"memory_mib"`
	DiskGiB     int            `json:"disk_gib,omitempty"` // overlay size; 0 = the image's size
	GPUs        int            `json:"gpus,omitempty"`
	Slots       []string       `json:"slots,omitempty"` // approved slot ids on the host
	Network     NetworkSpec    `json:"network,omitempty"`
	CloudInit   *CloudInit     `json:"cloud_init,omitempty"`
	Readiness   Readiness      `json:"readiness,omitempty"`
	HealthCheck *HealthCheck   `json:"health_check,omitempty"`
	// Secrets names secrets the instance needs; a missing one fails the
	// instance with secrets_missing.
	Secrets []string `json:"secrets,omitempty"`
	// GracefulTimeout bounds a graceful stop before the VM is killed
	// (default 30s).
	GracefulTimeout Duration `json:"graceful_timeout,omitempty"`
	// Preset is the preset input this spec was expanded from (display;
	// the agent pulls an Ollama preset's model after start).
	Preset *PresetRequest `json:"preset,omitempty"`
}

// Resources is the capacity the spec takes on its host. A container's GPUs
// count by the ones it names (["all"] counts GPUs).
func (s InstanceSpec) Resources() Capacity {
	gpus := s.GPUs
	if c := s.Container; c != nil && !slices.Contains(c.GPUs, GPUsAll) {
		gpus = max(gpus, len(c.GPUs))
	}
	return Capacity{VCPUs: s.VCPUs, MemoryMiB: s.MemoryMiB, DiskGiB: s.DiskGiB, GPUs: gpus}
}

// InstanceRuntime is what the agent reports about a running instance.
type InstanceRuntime struct {
	Runtime   string         `json:"runtime,omitempty"` // "qemu", "mock"
	Accel     string         `json:"accel,omitempty"`
	PID       int            `json:"pid,omitempty"`
	Ports     map[string]int `json:"ports,omitempty"` // forward name → host port
	StartedAt *time.Time     `json:"started_at,omitempty"`
	Restarts  int            `json:"restarts,omitempty"`
}

// Instance is an instance record as the operator API shows it.
type Instance struct {
	ID           string            `json:"instance_id"`
	Name         string            `json:"name"`
	Group        string            `json:"group,omitempty"`
	HostID       string            `json:"host_id"`
	Labels       map[string]string `json:"labels,omitempty"`
	Spec         InstanceSpec      `json:"spec"`
	DesiredState DesiredState      `json:"desired_state"`
	Generation   int64             `json:"generation"`
	// Status as last reported by the agent.
	Phase              InstancePhase    `json:"phase"`
	ReasonCode         ReasonCode       `json:"reason_code,omitempty"`
	Message            string           `json:"message,omitempty"`
	ObservedGeneration int64            `json:"observed_generation"`
	Runtime            *InstanceRuntime `json:"runtime,omitempty"`
	StatusAt           *time.Time       `json:"status_at,omitempty"`
	CreatedBy          string           `json:"created_by,omitempty"`
	CreatedAt          time.Time        `json:"created_at"`
	UpdatedAt          time.Time        `json:"updated_at"`
}

// CreateInstanceRequest is POST /api/v1/instances. HostID pins the
// instance to a host; otherwise the control plane places it on a
// schedulable host whose labels include HostLabels and that has room.
// Exactly one of Spec and Preset is given: the control plane expands a
// preset into the spec it stores.
type CreateInstanceRequest struct {
	Name       string            `json:"name"`
	Group      string            `json:"group,omitempty"`
	HostID     string            `json:"host_id,omitempty"`
	HostLabels map[string]string `json:"host_labels,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Spec       InstanceSpec      `json:"spec"`
	Preset     *PresetRequest    `json:"preset,omitempty"`
}

// ScaleRequest is POST /api/v1/instance-groups/{group}/scale: create or
// delete instances named <group>-<n> until Replicas are wanted. Template is
// needed only when the group has no instance yet.
type ScaleRequest struct {
	Replicas   int                    `json:"replicas"`
	Template   *CreateInstanceRequest `json:"template,omitempty"`
	HostLabels map[string]string      `json:"host_labels,omitempty"`
}

// ScaleResponse lists what a scale created and deleted.
type ScaleResponse struct {
	Group    string     `json:"group"`
	Replicas int        `json:"replicas"`
	Created  []Instance `json:"created,omitempty"`
	Deleted  []string   `json:"deleted,omitempty"`
}

// DesiredInstance is one instance in a node's desired set.
type DesiredInstance struct {
	ID           string       `json:"instance_id"`
	Name         string       `json:"name"`
	Generation   int64        `json:"generation"`
	DesiredState DesiredState `json:"desired_state"`
	Spec         InstanceSpec `json:"spec"`
	// PCIDevices are the host PCI addresses of the instance's approved slots
	// (each slot's GPU, then its fabric VF), resolved by the control plane;
	// the agent passes them through with VFIO.
	PCIDevices []string `json:"pci_devices,omitempty"`
}

// NodeInstances is GET /internal/v1/nodes/{id}/instances: the node's whole
// desired set. ETag changes whenever the set changes; the agent passes it
// back as ?etag= to long-poll for the next change (&wait=30s).
type NodeInstances struct {
	ETag      string            `json:"etag"`
	Draining  bool              `json:"draining"`
	Instances []DesiredInstance `json:"instances"`
}

// InstanceStatusReport is POST /internal/v1/nodes/{id}/instances/{iid}/status:
// one transition, sent only when the phase or reason changes.
type InstanceStatusReport struct {
	Generation int64            `json:"generation"`
	Phase      InstancePhase    `json:"phase"`
	ReasonCode ReasonCode       `json:"reason_code,omitempty"`
	Message    string           `json:"message,omitempty"`
	At         time.Time        `json:"at"`
	Runtime    *InstanceRuntime `json:"runtime,omitempty"`
}

// InstanceEvent is one recorded status transition of an instance (GET
// /api/v1/instances/{id}/events): its creation, an operator's desired-state
// change, or a phase or reason change its agent reported. Seq numbers an
// instance's events in the order they were recorded; At is the control
// plane's clock. Actor is "node:<id>" or the operator that acted.
type InstanceEvent struct {
	InstanceID         string        `json:"instance_id"`
	Seq                int64         `json:"seq"`
	At                 time.Time     `json:"at"`
	Phase              InstancePhase `json:"phase"`
	ReasonCode         ReasonCode    `json:"reason_code,omitempty"`
	Message            string        `json:"message,omitempty"`
	DesiredState       DesiredState  `json:"desired_state"`
	Generation         int64         `json:"generation"`
	ObservedGeneration int64         `json:"observed_generation"`
	Actor              string        `json:"actor"`
	CorrelationID      string        `json:"correlation_id,omitempty"`
}
