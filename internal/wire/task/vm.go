package task

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Slice VM task types and their limits (docs/contract.md).
const (
	// TypeVMProvision provisions a slice VM with its slots passed through
	// (internal/node/slicevm). Phase-timed; a failure runs deferred cleanup.
	TypeVMProvision = "slice.vm_provision"
	// VMProvisionTimeout bounds slice.vm_provision on the agent.
	VMProvisionTimeout = 20 * time.Minute
	// TypeVMRelease shuts a slice VM down, undefines it and frees its slots.
	TypeVMRelease = "slice.vm_release"
	// VMReleaseTimeout bounds slice.vm_release on the agent.
	VMReleaseTimeout = 20 * time.Minute

	// Driver strategies: how the guest gets its GPU driver.
	DriverCloudInit    = "cloud-init"
	DriverPreinstalled = "preinstalled"
	DriverNone         = "none"

	// DefaultVMUsername is the guest user when default_username is not given.
	DefaultVMUsername = "drover"
	// DefaultSlotVCPUs and DefaultSlotMemoryMiB are a slot's share of the VM.
	DefaultSlotVCPUs     = 12
	DefaultSlotMemoryMiB = 65536
	// DefaultVMVCPUs and DefaultVMMemoryMiB size a slot-less VM (Drover).
	DefaultVMVCPUs     = 2
	DefaultVMMemoryMiB = 2048
	// Graceful shutdown bounds (seconds).
	DefaultGracefulTimeoutSeconds = 60
	MinGracefulTimeoutSeconds     = 30
	MaxGracefulTimeoutSeconds     = 900
	// Readiness wait bounds (seconds, Drover).
	DefaultReadinessTimeoutSeconds = 600
	MinReadinessTimeoutSeconds     = 5
	MaxReadinessTimeoutSeconds     = 900
	// ReadinessMarkerPrefix + vm_name is the default readiness marker: the
	// line the guest's cloud-init prints on its serial console once it has
	// finished (internal/node/cloudinit's DefaultReadyPrefix).
	ReadinessMarkerPrefix = "DROVER-READY "

	// Upper bounds that keep params small.
	MaxVMSlots         = 16
	MaxSSHKeys         = 32
	MaxSSHKeyLen       = 16 << 10
	MaxSlotVCPUs       = 1024
	MaxVMMemoryMiB     = 16 << 20 // 16 TiB
	MinVMMemoryMiB     = 128
	MaxReadinessMarker = 256
	MaxCmdlineLen      = 4096
)

// VMSlot is one slot passed through to a slice VM.
type VMSlot struct {
	SlotID    string `json:"slot_id"`
	SlotIndex int    `json:"slot_index"`
	// PCIAddress is the GPU's PCI address ("0000:3b:00.0").
	PCIAddress string `json:"pci_address"`
	// FabricDevice is the fabric VF's PCI address; empty for none.
	FabricDevice string `json:"fabric_device,omitempty"`
	// NVMeDevice is the slot's NVMe namespace (a /dev path, by-id
	// preferred); the first slot's is the boot disk. Empty for none.
	NVMeDevice string `json:"nvme_device,omitempty"`
	NUMANode   int    `json:"numa_node,omitempty"`
	VCPUCount  int    `json:"vcpu_count,omitempty"` // default DefaultSlotVCPUs
	MemoryMiB  int    `json:"memory_mib,omitempty"` // default DefaultSlotMemoryMiB
	// MACAddress and PrivateIP form the slot's DHCP reservation; give both
	// or neither.
	MACAddress string `json:"mac_address,omitempty"`
	PrivateIP  string `json:"private_ip,omitempty"`
}

// VMProvisionParams are the params of slice.vm_provision. The
// fields after GracefulTimeoutSeconds are Drover's additions to the task.
type VMProvisionParams struct {
	AllocationID string `json:"allocation_id"`
	// VMName names the VM, its leases and files: runtime.ValidID.
	VMName string `json:"vm_name"`
	// ImagePath (absolute, under the node's image directories) or
	// ImageURL (http, https or file): exactly one.
	ImagePath       string   `json:"image_path,omitempty"`
	ImageURL        string   `json:"image_url,omitempty"`
	ImageSHA256     string   `json:"image_sha256"`
	ImageTrusted    bool     `json:"image_trusted,omitempty"`
	DriverStrategy  string   `json:"driver_strategy,omitempty"`  // default DriverCloudInit
	DefaultUsername string   `json:"default_username,omitempty"` // default DefaultVMUsername
	SSHPublicKeys   []string `json:"ssh_public_keys,omitempty"`
	Slots           []VMSlot `json:"slots,omitempty"`
	// OVSBridge, with slots, attaches the VM to the slice network (a tap
	// on this Open vSwitch bridge, the first slot's MAC).
	OVSBridge              string `json:"ovs_bridge,omitempty"`
	GracefulTimeoutSeconds int    `json:"graceful_timeout_seconds,omitempty"` // default 60

	// Drover: VCPUs and MemoryMiB size a VM without slots (slots may be
	// empty: a plain VM on a host with no GPU); with slots the VM gets the
	// sum of the slots' shares and these must be 0.
	VCPUs     int `json:"vcpus,omitempty"`
	MemoryMiB int `json:"memory_mib,omitempty"`
	// Drover: Boot boots a kernel (and initrd) directly.
	Boot *api.DirectBoot `json:"boot,omitempty"`
	// Drover: Network overrides the VM's network; the default is
	// user-mode networking with an "ssh" forward to guest port 22 (or, with
	// slots and OVSBridge, a tap on the bridge).
	Network *api.NetworkSpec `json:"network,omitempty"`
	// Drover: ReadinessMarker is the serial console line that means ready
	// (default ReadinessMarkerPrefix + VMName); ReadinessTimeoutSeconds bounds the
	// wait (default 600).
	ReadinessMarker         string `json:"readiness_marker,omitempty"`
	ReadinessTimeoutSeconds int    `json:"readiness_timeout_seconds,omitempty"`
	// Drover: Accel overrides the runtime's accelerator (kvm, nvmm, hvf,
	// tcg); slots need kvm.
	Accel string `json:"accel,omitempty"`
}

// WithDefaults returns p with empty fields set to their defaults (slots
// included). Network stays nil when not given: the provisioner chooses.
func (p VMProvisionParams) WithDefaults() VMProvisionParams {
	if p.DriverStrategy == "" {
		p.DriverStrategy = DriverCloudInit
	}
	if p.DefaultUsername == "" {
		p.DefaultUsername = DefaultVMUsername
	}
	if p.GracefulTimeoutSeconds == 0 {
		p.GracefulTimeoutSeconds = DefaultGracefulTimeoutSeconds
	}
	if p.ReadinessMarker == "" {
		p.ReadinessMarker = ReadinessMarkerPrefix + p.VMName
	}
	if p.ReadinessTimeoutSeconds == 0 {
		p.ReadinessTimeoutSeconds = DefaultReadinessTimeoutSeconds
	}
	p.ImageSHA256 = strings.ToLower(p.ImageSHA256)
	p.Slots = append([]VMSlot(nil), p.Slots...)
	for i := range p.Slots {
		s := &p.Slots[i]
		if s.VCPUCount == 0 {
			s.VCPUCount = DefaultSlotVCPUs
		}
		if s.MemoryMiB == 0 {
			s.MemoryMiB = DefaultSlotMemoryMiB
		}
		s.MACAddress = strings.ToLower(s.MACAddress)
	}
	if len(p.Slots) == 0 {
		if p.VCPUs == 0 {
			p.VCPUs = DefaultVMVCPUs
		}
		if p.MemoryMiB == 0 {
			p.MemoryMiB = DefaultVMMemoryMiB
		}
	}
	return p
}

// TotalVCPUs is the VM's vCPU count: the slots' sum, else VCPUs.
func (p VMProvisionParams) TotalVCPUs() int {
	if len(p.Slots) == 0 {
		return p.VCPUs
	}
	n := 0
	for _, s := range p.Slots {
		n += s.VCPUCount
	}
	return n
}

// TotalMemoryMiB is the VM's memory: the slots' sum, else MemoryMiB.
func (p VMProvisionParams) TotalMemoryMiB() int {
	if len(p.Slots) == 0 {
		return p.MemoryMiB
	}
	n := 0
	for _, s := range p.Slots {
		n += s.MemoryMiB
	}
	return n
}

// DecodeVMProvisionParams strictly decodes and validates the params of
// slice.vm_provision; the server and the agent both use it. Every bad field
// is named. The result has defaults applied.
func DecodeVMProvisionParams(params json.RawMessage) (VMProvisionParams, []api.FieldError) {
	// Nested objects are decoded one by one so that an unknown or
	// mistyped field is named with its full path ("slots[1].gpu").
	var shadow struct {
		VMProvisionParams
		Slots   []json.RawMessage `json:"slots,omitempty"`
		Boot    json.RawMessage   `json:"boot,omitempty"`
		Network json.RawMessage   `json:"network,omitempty"`
	}
	if fe := DecodeParams(params, &shadow); fe != nil {
		return VMProvisionParams{}, unembed(fe, "VMProvisionParams")
	}
	p := shadow.VMProvisionParams
	var v fieldErrs
	if len(shadow.Slots) > MaxVMSlots {
		v.add("slots", fmt.Sprintf("at most %d slots", MaxVMSlots))
		return VMProvisionParams{}, v.fe
	}
	p.Slots = make([]VMSlot, len(shadow.Slots))
	for i, raw := range shadow.Slots {
		v.fe = append(v.fe, decodeNested(raw, &p.Slots[i], fmt.Sprintf("slots[%d]", i))...)
	}
	if len(shadow.Boot) > 0 && string(shadow.Boot) != "null" {
		p.Boot = new(api.DirectBoot)
		v.fe = append(v.fe, decodeNested(shadow.Boot, p.Boot, "boot")...)
	}
	if len(shadow.Network) > 0 && string(shadow.Network) != "null" {
		p.Network = new(api.NetworkSpec)
		v.fe = append(v.fe, decodeNested(shadow.Network, p.Network, "network")...)
	}
	if v.fe != nil {
		return VMProvisionParams{}, v.fe
	}
	v.check("allocation_id", checkRequired(p.AllocationID, checkToken))
	v.check("vm_name", checkVMName(p.VMName))
	switch {
	case p.ImagePath == "" && p.ImageURL == "":
		v.add("image_path", "one of image_path or image_url is required")
	case p.ImagePath != "" && p.ImageURL != "":
		v.add("image_url", "give image_path or image_url, not both")
	case p.ImagePath != "":
		v.check("image_path", checkAbsPath(p.ImagePath))
	default:
		v.check("image_url", checkArtifactURL(p.ImageURL))
	}
	v.check("image_sha256", checkRequired(p.ImageSHA256, checkSHA256))
	switch p.DriverStrategy {
	case "", DriverCloudInit, DriverPreinstalled, DriverNone:
	default:
		v.add("driver_strategy", "must be one of cloud-init, preinstalled, none")
	}
	if p.DefaultUsername != "" {
		v.check("default_username", checkUsername(p.DefaultUsername))
	}
	if len(p.SSHPublicKeys) > MaxSSHKeys {
		v.add("ssh_public_keys", fmt.Sprintf("at most %d keys", MaxSSHKeys))
	}
	for i, k := range p.SSHPublicKeys {
		v.check(fmt.Sprintf("ssh_public_keys[%d]", i), checkSSHKey(k))
	}
	validateVMSlots(&v, p.Slots)
	if p.OVSBridge != "" {
		v.check("ovs_bridge", checkIfaceName(p.OVSBridge))
	}
	v.check("graceful_timeout_seconds", checkOptRange(p.GracefulTimeoutSeconds, MinGracefulTimeoutSeconds, MaxGracefulTimeoutSeconds))
	if len(p.Slots) > 0 {
		if p.VCPUs != 0 {
			v.add("vcpus", "must be 0 with slots: set slots[].vcpu_count")
		}
		if p.MemoryMiB != 0 {
			v.add("memory_mib", "must be 0 with slots: set slots[].memory_mib")
		}
	} else {
		v.check("vcpus", checkOptRange(p.VCPUs, 1, MaxSlotVCPUs))
		v.check("memory_mib", checkOptRange(p.MemoryMiB, MinVMMemoryMiB, MaxVMMemoryMiB))
	}
	if p.Boot != nil {
		validateDirectBoot(&v, "boot", *p.Boot)
	}
	if p.Network != nil {
		validateNetwork(&v, "network", *p.Network)
	}
	if len(p.ReadinessMarker) > MaxReadinessMarker || hasControl(p.ReadinessMarker) {
		v.add("readiness_marker", fmt.Sprintf("must be at most %d printable characters", MaxReadinessMarker))
	}
	v.check("readiness_timeout_seconds", checkOptRange(p.ReadinessTimeoutSeconds, MinReadinessTimeoutSeconds, MaxReadinessTimeoutSeconds))
	switch p.Accel {
	case "", "kvm":
	case "nvmm", "hvf", "tcg":
		if len(p.Slots) > 0 {
			v.add("accel", "slots (VFIO passthrough) need kvm")
		}
	default:
		v.add("accel", "must be one of kvm, nvmm, hvf, tcg")
	}
	if v.fe != nil {
		return VMProvisionParams{}, v.fe
	}
	return p.WithDefaults(), nil
}

func validateVMSlots(v *fieldErrs, slots []VMSlot) {
	seen := map[string]string{} // "kind:value" → first field
	dup := func(field, kind, val string) {
		if val == "" {
			return
		}
		key := kind + ":" + strings.ToLower(val)
		if first, ok := seen[key]; ok {
			v.add(field, "duplicates "+first)
			return
		}
		seen[key] = field
	}
	for i, s := range slots {
		f := func(name string) string { return fmt.Sprintf("slots[%d].%s", i, name) }
		v.check(f("slot_id"), checkRequired(s.SlotID, checkToken))
		dup(f("slot_id"), "id", s.SlotID)
		if s.SlotIndex < 0 {
			v.add(f("slot_index"), "must be >= 0")
		}
		dup(f("slot_index"), "index", fmt.Sprint(s.SlotIndex))
		v.check(f("pci_address"), checkRequired(s.PCIAddress, checkPCIAddr))
		dup(f("pci_address"), "pci", s.PCIAddress)
		if s.FabricDevice != "" {
			v.check(f("fabric_device"), checkPCIAddr(s.FabricDevice))
			dup(f("fabric_device"), "pci", s.FabricDevice)
		}
		if s.NVMeDevice != "" {
			v.check(f("nvme_device"), checkAbsPath(s.NVMeDevice))
			dup(f("nvme_device"), "nvme", s.NVMeDevice)
		}
		if s.NUMANode < -1 {
			v.add(f("numa_node"), "must be >= -1")
		}
		v.check(f("vcpu_count"), checkOptRange(s.VCPUCount, 1, MaxSlotVCPUs))
		v.check(f("memory_mib"), checkOptRange(s.MemoryMiB, MinVMMemoryMiB, MaxVMMemoryMiB))
		if (s.MACAddress == "") != (s.PrivateIP == "") {
			v.add(f("mac_address"), "give mac_address and private_ip together (the DHCP reservation)")
		}
		if s.MACAddress != "" {
			v.check(f("mac_address"), checkMAC(s.MACAddress))
			dup(f("mac_address"), "mac", s.MACAddress)
		}
		if s.PrivateIP != "" {
			if a, err := netip.ParseAddr(s.PrivateIP); err != nil || !a.Is4() {
				v.add(f("private_ip"), `must be an IPv4 address, e.g. "10.77.0.10"`)
			}
			dup(f("private_ip"), "ip", s.PrivateIP)
		}
	}
}

func validateDirectBoot(v *fieldErrs, prefix string, b api.DirectBoot) {
	validateArtifact(v, prefix+".kernel", b.Kernel)
	if b.Initrd != nil {
		validateArtifact(v, prefix+".initrd", *b.Initrd)
	}
	if len(b.Cmdline) > MaxCmdlineLen || hasControl(b.Cmdline) {
		v.add(prefix+".cmdline", fmt.Sprintf("must be at most %d printable characters", MaxCmdlineLen))
	}
}

func validateArtifact(v *fieldErrs, prefix string, a api.Artifact) {
	v.check(prefix+".url", checkRequired(a.URL, checkArtifactURL))
	v.check(prefix+".sha256", checkRequired(a.SHA256, checkSHA256))
}

func validateNetwork(v *fieldErrs, prefix string, n api.NetworkSpec) {
	switch n.Mode {
	case "", api.NetworkUser:
		if n.Bridge != "" {
			v.add(prefix+".bridge", "only with mode tap")
		}
	case api.NetworkTap:
		v.check(prefix+".bridge", checkRequired(n.Bridge, checkIfaceName))
		if len(n.Forwards) > 0 {
			v.add(prefix+".forwards", "only with mode user")
		}
	default:
		v.add(prefix+".mode", "must be user or tap")
	}
	if n.MAC != "" {
		v.check(prefix+".mac", checkMAC(n.MAC))
	}
	names := map[string]bool{}
	for i, fw := range n.Forwards {
		f := func(name string) string { return fmt.Sprintf("%s.forwards[%d].%s", prefix, i, name) }
		if msg := checkRequired(fw.Name, checkToken); msg != "" {
			v.add(f("name"), msg)
		} else if names[fw.Name] {
			v.add(f("name"), "duplicate forward name")
		}
		names[fw.Name] = true
		if fw.GuestPort < 1 || fw.GuestPort > 65535 {
			v.add(f("guest_port"), "must be between 1 and 65535")
		}
		if fw.HostPort < 0 || fw.HostPort > 65535 {
			v.add(f("host_port"), "must be between 0 (any free port) and 65535")
		}
	}
}

// VMReleaseSlot is one slot of a released VM.
type VMReleaseSlot struct {
	SlotID       string `json:"slot_id"`
	PCIAddress   string `json:"pci_address,omitempty"`
	FabricDevice string `json:"fabric_device,omitempty"`
	NVMeDevice   string `json:"nvme_device,omitempty"`
}

// VMReleaseParams are the params of slice.vm_release. Slots may be left
// out: the agent then releases the slots its leases record for VMName.
type VMReleaseParams struct {
	VMName string `json:"vm_name"`
	// AllocationID is optional; when given it is recorded in the result.
	AllocationID           string          `json:"allocation_id,omitempty"`
	Slots                  []VMReleaseSlot `json:"slots,omitempty"`
	GracefulTimeoutSeconds int             `json:"graceful_timeout_seconds,omitempty"` // default 60
	// Wipe zeroes each slot's NVMe device after the VM is gone.
	Wipe bool `json:"wipe,omitempty"`
}

// WithDefaults returns p with empty fields set to their defaults.
func (p VMReleaseParams) WithDefaults() VMReleaseParams {
	if p.GracefulTimeoutSeconds == 0 {
		p.GracefulTimeoutSeconds = DefaultGracefulTimeoutSeconds
	}
	return p
}

// DecodeVMReleaseParams strictly decodes and validates the params of
// slice.vm_release. The result has defaults applied.
func DecodeVMReleaseParams(params json.RawMessage) (VMReleaseParams, []api.FieldError) {
	var shadow struct {
		VMReleaseParams
		Slots []json.RawMessage `json:"slots,omitempty"`
	}
	if fe := DecodeParams(params, &shadow); fe != nil {
		return VMReleaseParams{}, unembed(fe, "VMReleaseParams")
	}
	p := shadow.VMReleaseParams
	var v fieldErrs
	if len(shadow.Slots) > MaxVMSlots {
		v.add("slots", fmt.Sprintf("at most %d slots", MaxVMSlots))
		return VMReleaseParams{}, v.fe
	}
	p.Slots = make([]VMReleaseSlot, len(shadow.Slots))
	for i, raw := range shadow.Slots {
		v.fe = append(v.fe, decodeNested(raw, &p.Slots[i], fmt.Sprintf("slots[%d]", i))...)
	}
	if v.fe != nil {
		return VMReleaseParams{}, v.fe
	}
	v.check("vm_name", checkVMName(p.VMName))
	if p.AllocationID != "" {
		v.check("allocation_id", checkToken(p.AllocationID))
	}
	ids := map[string]bool{}
	for i, s := range p.Slots {
		f := func(name string) string { return fmt.Sprintf("slots[%d].%s", i, name) }
		if msg := checkRequired(s.SlotID, checkToken); msg != "" {
			v.add(f("slot_id"), msg)
		} else if ids[s.SlotID] {
			v.add(f("slot_id"), "duplicate slot_id")
		}
		ids[s.SlotID] = true
		if s.PCIAddress != "" {
			v.check(f("pci_address"), checkPCIAddr(s.PCIAddress))
		}
		if s.FabricDevice != "" {
			v.check(f("fabric_device"), checkPCIAddr(s.FabricDevice))
		}
		if s.NVMeDevice != "" {
			v.check(f("nvme_device"), checkAbsPath(s.NVMeDevice))
		}
	}
	v.check("graceful_timeout_seconds", checkOptRange(p.GracefulTimeoutSeconds, MinGracefulTimeoutSeconds, MaxGracefulTimeoutSeconds))
	if v.fe != nil {
		return VMReleaseParams{}, v.fe
	}
	return p.WithDefaults(), nil
}

func validateVMProvision(params json.RawMessage) []api.FieldError {
	_, fe := DecodeVMProvisionParams(params)
	return fe
}

func validateVMRelease(params json.RawMessage) []api.FieldError {
	_, fe := DecodeVMReleaseParams(params)
	return fe
}
