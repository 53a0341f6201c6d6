package runtime

import (
	"encoding/json"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Spec is one workload as the runtime sees it, whatever runs it (a QEMU VM
// today; a container or an OCI microVM later). The agent builds it from an
// api.InstanceSpec (reconcile.ToRuntimeSpec) or from slice.vm_provision's
// params. The fields every runtime understands come first; what only a VM
// has lives in VM. An adapter refuses, with a typed *Error naming the
// field, what it cannot run (qemu: an OCI image, a command, volumes, GPUs
// by index); the mock accepts anything.
//
// Adapters compare specs by their JSON (a Create of an existing id with
// another spec is ErrExists; the reconciler recreates an instance whose
// spec changed), so only what identifies the workload is encoded: Secrets
// and Readiness.HealthCheck are not.
type Spec struct {
	// ID names the instance's files, sockets and overlay: ValidID.
	ID string `json:"id"`
	// Owner says who manages the instance ("reconciler", "slice"); Recover
	// returns it so each owner finds its own.
	Owner string `json:"owner,omitempty"`
	// Image is what the workload runs: a disk image or an OCI image.
	Image Image `json:"image"`
	// Command and Args replace the image's entrypoint and its arguments;
	// Env is added to the image's environment (containers, microVMs).
	Command []string          `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Ports forward a host port on 127.0.0.1 to a workload TCP port
	// (named; HostPort 0 lets the runtime pick one). Status.Ports gives the
	// host ports by name.
	Ports     []api.PortForward `json:"ports,omitempty"`
	Volumes   []Volume          `json:"volumes,omitempty"`
	Devices   Devices           `json:"devices,omitempty"`
	Resources Resources         `json:"resources"`
	Readiness Readiness         `json:"readiness,omitempty"`
	// Secrets are delivered into the workload at /run/drover/secrets/<name>
	// (mode 0400; in a VM through the cloud-init seed, so they need
	// VM.CloudInit), and are never written to the runtime's state files.
	Secrets map[string][]byte `json:"-"`
	// VM holds what only a virtual machine has; nil reads as the zero
	// VMSpec. A container runtime refuses a spec that sets it.
	VM *VMSpec `json:"vm,omitempty"`
	// Container holds what only a container has; nil reads as the zero
	// ContainerSpec (the runtime's defaults). A VM runtime ignores it.
	Container *ContainerSpec `json:"container,omitempty"`
}

// ContainerSpec is what only a container has.
type ContainerSpec struct {
	// Ulimits are per-container resource limits by name (nofile, nproc),
	// soft and hard alike; unset ones take the runtime's defaults.
	Ulimits map[string]int64 `json:"ulimits,omitempty"`
	// RegistryAuth names the secret (in Spec.Secrets) holding the
	// registry credentials of the pull ({"username":…,"password":…}); it
	// is not mounted into the container.
	RegistryAuth string `json:"registry_auth,omitempty"`
	// ShmSizeMiB sizes the container's /dev/shm (0: the engine's default).
	ShmSizeMiB int `json:"shm_size_mib,omitempty"`
}

// ImageKind says what Spec.Image names.
type ImageKind string

// Image kinds.
const (
	// ImageDisk (the zero value) is a bootable disk image: URL (http(s) or
	// file://) and its SHA256, fetched and verified through the image
	// cache.
	ImageDisk ImageKind = ""
	// ImageOCI is an OCI image: Ref (registry/repo:tag) and, optionally,
	// the Digest it must resolve to.
	ImageOCI ImageKind = "oci"
)

// Image is a workload's image. A VM that boots from VM.BootDevice has
// none (the zero Image).
type Image struct {
	Kind ImageKind `json:"kind,omitempty"`
	// Disk images.
	URL    string `json:"url,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// OCI images.
	Ref    string `json:"ref,omitempty"`
	Digest string `json:"digest,omitempty"`
}

// DiskImage is the disk image of an artifact.
func DiskImage(a api.Artifact) Image { return Image{URL: a.URL, SHA256: a.SHA256} }

// Artifact is a disk image's URL and digest.
func (i Image) Artifact() api.Artifact { return api.Artifact{URL: i.URL, SHA256: i.SHA256} }

// IsOCI reports whether the image is an OCI image (a container's).
func (i Image) IsOCI() bool { return i.Kind == ImageOCI }

// IsZero reports whether the spec names no image.
func (i Image) IsZero() bool { return i == Image{} }

// Volume mounts host storage into the workload.
type Volume struct {
	Source   string `json:"source"` // a host path or a named volume
	Target   string `json:"target"` // the path inside the workload
	ReadOnly bool   `json:"read_only,omitempty"`
	// A microVM's named volume is created on first use with SizeGiB (0:
	// api.DefaultVolumeSizeGiB) and Format ("": raw; an existing volume
	// keeps its own); other runtimes refuse both (api.VolumeMount).
	SizeGiB int    `json:"size_gib,omitempty"`
	Format  string `json:"format,omitempty"`
}

// Devices are host devices given to the workload.
type Devices struct {
	// GPUs by index ("0") or UUID ("GPU-8c1e…"), for runtimes that map
	// GPUs themselves (containers).
	GPUs []string `json:"gpus,omitempty"`
	// PCI are host PCI addresses (0000:3b:00.0) passed through with VFIO:
	// a VM's GPUs and fabric VFs, resolved by the control plane.
	PCI []string `json:"pci,omitempty"`
}

// Resources is what the workload may use.
type Resources struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
	// DiskGiB sizes a VM's copy-on-write overlay of its disk image (0: the
	// image's size).
	DiskGiB int `json:"disk_gib,omitempty"`
}

// Readiness says when a started workload is Ready (api.Readiness: a
// serial marker, a TCP port through its forward, or both; neither: the
// process runs). HealthCheck, after Ready, is the cadence of the checks the
// reconciler runs through Probe; it is not part of the workload's identity
// (not encoded), so changing it recreates nothing.
type Readiness struct {
	api.Readiness
	HealthCheck *api.HealthCheck `json:"-"`
}

// VMSpec is what only a virtual machine has.
type VMSpec struct {
	// BootDevice is a raw block device (a slice's NVMe) to boot from
	// instead of an overlay of Spec.Image; it must be under the runtime's
	// allowed device paths.
	BootDevice string `json:"boot_device,omitempty"`
	// Boot, when set, boots a kernel (and initrd, cmdline) directly.
	Boot *api.DirectBoot `json:"boot,omitempty"`
	// Accel overrides the runtime's accelerator ("kvm", "nvmm", "tcg").
	Accel   string    `json:"accel,omitempty"`
	Network VMNetwork `json:"network,omitempty"`
	// CloudInit makes the runtime build a NoCloud seed (label cidata) with
	// its user and SSH keys; SeedISO instead attaches a seed the caller
	// built.
	CloudInit *api.CloudInit `json:"cloud_init,omitempty"`
	SeedISO   string         `json:"seed_iso,omitempty"`
	// MicroVM boots Spec.Image (an OCI image, or a raw ext4 root
	// filesystem with Spec.Command) as a microVM: the agent's kernel,
	// drover-init as PID 1, Command/Args/Env and Secrets through its
	// config drive (api.InstanceSpec.Runtime "microvm"). A Router sends
	// such a spec to its VM runtime even with an OCI image.
	MicroVM bool `json:"microvm,omitempty"`
}

// VMNetwork is a VM's network device: user-mode networking (the default,
// with Spec.Ports as its forwards) or a tap device enslaved to Bridge.
type VMNetwork struct {
	Mode   string `json:"mode,omitempty"` // api.NetworkUser (default) or api.NetworkTap
	Bridge string `json:"bridge,omitempty"`
	MAC    string `json:"mac,omitempty"`
}

// VMOrZero returns the VM section, the zero VMSpec when there is none.
func (s Spec) VMOrZero() VMSpec {
	if s.VM == nil {
		return VMSpec{}
	}
	return *s.VM
}

// ContainerOrZero returns the container section, the zero ContainerSpec
// when there is none.
func (s Spec) ContainerOrZero() ContainerSpec {
	if s.Container == nil {
		return ContainerSpec{}
	}
	return *s.Container
}

// legacySpec is the flat, VM-only spec that agents before the VM section
// persisted (qemu's spec.json); UnmarshalJSON still reads it, so an
// upgraded agent re-adopts the instances an older one started.
type legacySpec struct {
	DiskGiB    int              `json:"disk_gib"`
	BootDevice string           `json:"boot_device"`
	Boot       *api.DirectBoot  `json:"boot"`
	VCPUs      int              `json:"vcpus"`
	MemoryMiB  int              `json:"memory_mib"`
	Accel      string           `json:"accel"`
	Network    *api.NetworkSpec `json:"network"`
	CloudInit  *api.CloudInit   `json:"cloud_init"`
	SeedISO    string           `json:"seed_iso"`
	PCIDevices []string         `json:"pci_devices"`
}

// UnmarshalJSON decodes a spec, in this shape or the legacy flat one (which
// has vcpus at the top and no resources).
func (s *Spec) UnmarshalJSON(b []byte) error {
	type plain Spec // without this method
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return err
	}
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	_, hasResources := keys["resources"]
	_, hasVCPUs := keys["vcpus"]
	if hasResources || !hasVCPUs {
		*s = Spec(p)
		return nil
	}
	var l legacySpec
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	p.Resources = Resources{VCPUs: l.VCPUs, MemoryMiB: l.MemoryMiB, DiskGiB: l.DiskGiB}
	p.Devices.PCI = l.PCIDevices
	vm := &VMSpec{BootDevice: l.BootDevice, Boot: l.Boot, Accel: l.Accel, CloudInit: l.CloudInit, SeedISO: l.SeedISO}
	if n := l.Network; n != nil {
		vm.Network = VMNetwork{Mode: n.Mode, Bridge: n.Bridge, MAC: n.MAC}
		p.Ports = n.Forwards
	}
	p.VM = vm
	*s = Spec(p)
	return nil
}
