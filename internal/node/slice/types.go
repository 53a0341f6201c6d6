package slice

// The output of slice.topology_discover. Key names are a
// contract: the control plane and operators read them as they are.

// Topology is the whole discovery result.
type Topology struct {
	// HostID is the identity the slot MACs are derived from.
	HostID        string         `json:"host_id"`
	Prerequisites Prerequisites  `json:"prerequisites"`
	GPUDevices    []GPUDevice    `json:"gpu_devices"`
	FabricDevices []FabricDevice `json:"fabric_devices"`
	NVMeDevices   []NVMeDevice   `json:"nvme_devices"`
	// CandidateSlots pair each GPU with an NVMe namespace and, where the
	// host has Mellanox adapters, a fabric VF; see CandidateSummary for
	// what stops them from being schedulable.
	CandidateSlots   []CandidateSlot  `json:"candidate_slots"`
	CandidateSummary CandidateSummary `json:"candidate_summary"`
	// ApprovalRequired is always true: discovery proposes, an operator
	// approves, and nothing is written here.
	ApprovalRequired bool `json:"approval_required"`
}

// Prerequisites are the host readiness facts.
type Prerequisites struct {
	KVMAvailable    bool `json:"kvm_available"`     // <dev>/kvm exists
	IOMMUGroupCount int  `json:"iommu_group_count"` // non-zero: VFIO usable
	// IOMMUKernelArgs are the IOMMU arguments present on the kernel command
	// line, of intel_iommu=on, amd_iommu=on, iommu=pt; [] when none.
	IOMMUKernelArgs   []string          `json:"iommu_kernel_args"`
	CPUVirtualization CPUVirtualization `json:"cpu_virtualization"`
	// LoadedModules says, per module slices care about, whether it is
	// loaded or built in.
	LoadedModules map[string]bool `json:"loaded_modules"`
	// RequiredCommands says, per command, whether it is installed and
	// where: the commands Drover's provisioning runs (RequiredCommands,
	// required true: missing is a blocker) and the seed contract's tools
	// it does not run (SeedCommands, required false: informational).
	RequiredCommands map[string]Command `json:"required_commands"`
	SliceNetwork     SliceNetwork       `json:"slice_network"`
	// RebootRequired is true when a reboot-required marker file exists.
	RebootRequired bool `json:"reboot_required"`
}

// CPUVirtualization reports the hardware virtualisation CPU flags.
type CPUVirtualization struct {
	VMX bool `json:"vmx"` // Intel VT-x
	SVM bool `json:"svm"` // AMD-V
}

// Command is one command of prerequisites.required_commands.
type Command struct {
	Present bool   `json:"present"`
	Path    string `json:"path,omitempty"`
	// Required: Drover's slice provisioning runs it (missing is the
	// blocker command_missing:<cmd>); false: a seed tool, informational.
	Required bool `json:"required"`
}

// SliceNetwork is what the slice network needs on the host.
type SliceNetwork struct {
	OVSBridge        string `json:"ovs_bridge"`
	OVSBridgePresent bool   `json:"ovs_bridge_present"`
	// OVSBridgeKind is "ovs" (no Linux bridge directory and the ovs-system
	// datapath exists), "linux_bridge", "unknown", or "" when absent.
	OVSBridgeKind string `json:"ovs_bridge_kind"`
	// IPForward is net.ipv4.ip_forward; null when unreadable.
	IPForward *bool `json:"ip_forward"`
	// NAT is "unknown": discovery does not run iptables or nft.
	NAT             string           `json:"nat"`
	PrivateCIDR     string           `json:"private_cidr"`
	IPoIBInterfaces []IPoIBInterface `json:"ipoib_interfaces"`
}

// IPoIBInterface is one InfiniBand net interface.
type IPoIBInterface struct {
	Name       string `json:"name"`
	OperState  string `json:"operstate"`
	PCIAddress string `json:"pci_address,omitempty"`
	// NetplanConfigured is true when a file in <root>/etc/netplan names it.
	NetplanConfigured bool `json:"netplan_configured"`
}

// GPUDevice is one NVIDIA or AMD GPU function.
type GPUDevice struct {
	PCIAddress string `json:"pci_address"`
	Vendor     string `json:"vendor"` // nvidia | amd
	VendorID   string `json:"vendor_id"`
	DeviceID   string `json:"device_id"`
	Model      string `json:"model"` // pci.ids name, else "<vendor> <device_id>"
	Driver     string `json:"driver"`
	NUMANode   int    `json:"numa_node"`   // -1 when unknown
	IOMMUGroup *int   `json:"iommu_group"` // null when the IOMMU is off
	// IOMMUGroupDevices are all functions in the GPU's IOMMU group (they
	// pass through together).
	IOMMUGroupDevices []string `json:"iommu_group_devices"`
}

// FabricDevice is one Mellanox physical function.
type FabricDevice struct {
	PCIAddress    string            `json:"pci_address"`
	VendorID      string            `json:"vendor_id"`
	DeviceID      string            `json:"device_id"`
	Model         string            `json:"model"`
	Driver        string            `json:"driver"`
	NUMANode      int               `json:"numa_node"`
	IOMMUGroup    *int              `json:"iommu_group"`
	Interfaces    []FabricInterface `json:"interfaces"`
	SRIOVTotalVFs int               `json:"sriov_total_vfs"`
	SRIOVNumVFs   int               `json:"sriov_num_vfs"`
	VFs           []FabricVF        `json:"vfs"`
}

// FabricInterface is a net interface of a fabric PF.
type FabricInterface struct {
	Name      string `json:"name"`
	LinkType  string `json:"link_type"` // infiniband | ethernet | other
	OperState string `json:"operstate"`
	SpeedMbps int    `json:"speed_mbps"`
}

// FabricVF is one SR-IOV virtual function.
type FabricVF struct {
	Index      int    `json:"index"`
	PCIAddress string `json:"pci_address"`
	Driver     string `json:"driver"`
	NUMANode   int    `json:"numa_node"`
	IOMMUGroup *int   `json:"iommu_group"`
}

// NVMeDevice is one NVMe namespace.
type NVMeDevice struct {
	Name       string `json:"name"`
	Path       string `json:"path"`
	ByIDPath   string `json:"by_id_path"` // "" when udev made no by-id link
	Model      string `json:"model"`
	Serial     string `json:"serial"`
	SizeBytes  uint64 `json:"size_bytes"`
	PCIAddress string `json:"pci_address"`
	NUMANode   int    `json:"numa_node"`
	IOMMUGroup *int   `json:"iommu_group"`
	// InUse is true when the namespace or a partition is mounted, used as
	// swap, or has holders (LVM, md); such a namespace is never proposed.
	InUse       bool     `json:"in_use"`
	MountPoints []string `json:"mount_points"`
	Holders     []string `json:"holders"`
}

// CandidateSlot is one proposed slot, in the shape slice.vm_provision's
// slots take (less slot_id, vCPUs and memory, set at approval).
type CandidateSlot struct {
	SlotIndex  int    `json:"slot_index"`
	PCIAddress string `json:"pci_address"` // the GPU
	NUMANode   int    `json:"numa_node"`   // the GPU's
	// FabricDevice is the VF's PCI address; null when the host has no
	// fabric VF for this slot.
	FabricDevice *string `json:"fabric_device"`
	FabricNUMA   *int    `json:"fabric_numa_node"`
	// NVMeDevice is the namespace's by-id path (its /dev path when it has
	// none); null when no free namespace was left.
	NVMeDevice  *string `json:"nvme_device"`
	NVMeNUMA    *int    `json:"nvme_numa_node"`
	MACAddress  string  `json:"mac_address"`
	PrivateIP   *string `json:"private_ip"` // null when the CIDR is exhausted
	Schedulable bool    `json:"schedulable"`
}

// CandidateSummary says whether the slots can be used.
type CandidateSummary struct {
	SlotCount        int       `json:"slot_count"`
	SchedulableSlots int       `json:"schedulable_slots"`
	HostReady        bool      `json:"host_ready"` // no host-wide blocker
	Blockers         []Blocker `json:"blockers"`
	// Notices are informational findings (NoticeCommandAbsentPrefix,
	// BlockerOVSBridgeNotOVS): they block neither a slot nor approval.
	Notices []Blocker `json:"notices"`
}

// Blocker is one reason a slot, or the whole host (SlotIndex null), is not
// schedulable. Code is stable (Blocker* constants; "command_missing:<cmd>"
// names the command); Message says what to do.
type Blocker struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	SlotIndex *int   `json:"slot_index"`
}

// Blocker codes.
const (
	BlockerUnsupportedOS        = "unsupported_os"
	BlockerNoGPUs               = "no_gpus"
	BlockerKVMUnavailable       = "kvm_unavailable"
	BlockerCPUVirtMissing       = "cpu_virtualization_missing"
	BlockerIOMMUDisabled        = "iommu_disabled"
	BlockerVFIOModulesMissing   = "vfio_modules_missing"
	BlockerCommandMissingPrefix = "command_missing:"
	// NoticeCommandAbsentPrefix: a seed tool Drover does not run is not
	// installed (a notice, "command_absent:<cmd>").
	NoticeCommandAbsentPrefix  = "command_absent:"
	BlockerOVSBridgeMissing    = "ovs_bridge_missing"
	BlockerOVSBridgeNotOVS     = "ovs_bridge_not_ovs"
	BlockerIPForwardDisabled   = "ip_forward_disabled"
	BlockerRebootRequired      = "reboot_required"
	BlockerMountStateUnknown   = "nvme_mount_state_unknown"
	BlockerNVMeUnavailable     = "nvme_unavailable"
	BlockerNVMeMounted         = "nvme_mounted"
	BlockerNVMeByIDMissing     = "nvme_by_id_missing"
	BlockerFabricVFUnavailable = "fabric_vf_unavailable"
	BlockerGPUNUMAMismatch     = "gpu_numa_mismatch"
	BlockerGPUIOMMUGroupShared = "gpu_iommu_group_shared"
	BlockerPrivateIPExhausted  = "private_ip_exhausted"
)
