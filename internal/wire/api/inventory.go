package api

import (
	"strings"
	"time"
)

// HostInventory is the full description of a host an agent reports: CPU,
// memory, OS, disks, filesystems, NICs and the PCI devices that matter for
// placement (GPUs, fabric adapters, NVMe namespaces, IOMMU groups).
// internal/node/hostinfo collects it. Sections the agent could not read are
// empty and explained in Warnings; sizes are bytes unless the name says
// otherwise.
type HostInventory struct {
	Hostname    string             `json:"hostname"`
	OS          OSInfo             `json:"os"`
	CPU         CPUInfo            `json:"cpu"`
	Memory      MemoryInfo         `json:"memory"`
	NUMANodes   []NUMANode         `json:"numa_nodes"`
	Disks       []Disk             `json:"disks"`
	Filesystems []Filesystem       `json:"filesystems"`
	NICs        []NIC              `json:"nics"`
	GPUs        []GPU              `json:"gpus"`
	Fabric      []FabricDevice     `json:"fabric"`
	NVMe        []NVMeNamespace    `json:"nvme"`
	IOMMUGroups []IOMMUGroup       `json:"iommu_groups"`
	Warnings    []InventoryWarning `json:"warnings,omitempty"`
	CollectedAt time.Time          `json:"collected_at"`
}

// OSInfo names the operating system.
type OSInfo struct {
	Family        string `json:"family"` // an os_family: linux | dragonflybsd | windows | darwin
	KernelVersion string `json:"kernel_version"`
	Arch          string `json:"arch"`                   // GOARCH, e.g. "amd64"
	Distribution  string `json:"distribution,omitempty"` // os-release PRETTY_NAME, e.g. "Debian GNU/Linux 12 (bookworm)"
}

// CPUInfo describes the processors. Sockets × cores per socket = Cores;
// Threads counts logical CPUs.
type CPUInfo struct {
	Vendor  string `json:"vendor,omitempty"` // "GenuineIntel", "AuthenticAMD", ...
	Model   string `json:"model"`
	Sockets int    `json:"sockets"`
	Cores   int    `json:"cores"`
	Threads int    `json:"threads"`
	// Virtualization lists the hardware virtualisation flags present:
	// "vmx" (Intel VT-x) and/or "svm" (AMD-V); empty when neither.
	Virtualization []string `json:"virtualization"`
	// Hypervisor is true when the CPU reports running under a hypervisor.
	Hypervisor bool `json:"hypervisor"`
}

// MemoryInfo is system memory (never the agent's own heap).
type MemoryInfo struct {
	TotalBytes     uint64 `json:"total_bytes"`
	AvailableBytes uint64 `json:"available_bytes"`
	FreeBytes      uint64 `json:"free_bytes"`
	SwapTotalBytes uint64 `json:"swap_total_bytes"`
	TotalMiB       int    `json:"total_mib"`
	AvailableMiB   int    `json:"available_mib"`
}

// NUMANode is one NUMA node.
type NUMANode struct {
	ID         int    `json:"id"`
	CPUs       string `json:"cpus"` // kernel cpulist, e.g. "0-31,64-95"
	TotalBytes uint64 `json:"total_bytes"`
}

// Disk is one block device (whole disk, not partition).
type Disk struct {
	Name       string `json:"name"` // "nvme0n1", "sda", "vda"
	Path       string `json:"path"` // "/dev/nvme0n1"
	ByIDPath   string `json:"by_id_path,omitempty"`
	Kind       string `json:"kind"` // nvme | scsi | virtio | other
	SizeBytes  uint64 `json:"size_bytes"`
	Model      string `json:"model,omitempty"`
	Serial     string `json:"serial,omitempty"`
	Rotational bool   `json:"rotational"`
	Removable  bool   `json:"removable"`
	PCIAddress string `json:"pci_address,omitempty"`
	NUMANode   int    `json:"numa_node"` // -1 when unknown
}

// Filesystem is one mounted filesystem and its usage.
type Filesystem struct {
	Device      string  `json:"device"`
	MountPoint  string  `json:"mount_point"`
	FSType      string  `json:"fs_type"`
	TotalBytes  uint64  `json:"total_bytes"`
	UsedBytes   uint64  `json:"used_bytes"`
	FreeBytes   uint64  `json:"free_bytes"` // available to unprivileged users
	UsedPercent float64 `json:"used_percent"`
}

// NIC is one network interface other than loopback.
type NIC struct {
	Name       string `json:"name"`
	MAC        string `json:"mac,omitempty"`
	OperState  string `json:"operstate,omitempty"` // up | down | unknown | ...
	Up         bool   `json:"up"`
	SpeedMbps  int    `json:"speed_mbps"` // 0 when unknown or link down
	MTU        int    `json:"mtu,omitempty"`
	LinkType   string `json:"link_type,omitempty"` // ethernet | infiniband | other
	Virtual    bool   `json:"virtual"`
	Driver     string `json:"driver,omitempty"`
	PCIAddress string `json:"pci_address,omitempty"`
}

// PCIFunction is the identity of one PCI function as sysfs shows it.
// VendorName and DeviceName come from a pci.ids database and are empty when
// none is installed; the hex ids are always set.
type PCIFunction struct {
	Address    string `json:"pci_address"` // "0000:3b:00.0"
	VendorID   string `json:"vendor_id"`   // "0x10de"
	DeviceID   string `json:"device_id"`   // "0x2330"
	Class      string `json:"class"`       // "0x030200"
	VendorName string `json:"vendor_name,omitempty"`
	DeviceName string `json:"device_name,omitempty"`
	Driver     string `json:"driver,omitempty"`
	NUMANode   int    `json:"numa_node"`   // -1 when unknown
	IOMMUGroup *int   `json:"iommu_group"` // null when the IOMMU is off
}

// GPU is a display/3D controller from NVIDIA, AMD or Intel. The NVIDIA
// fields come from NVML or nvidia-smi and are empty when neither answered
// (no driver, or the GPU is bound to vfio-pci).
type GPU struct {
	PCIFunction
	Vendor        string `json:"vendor"` // nvidia | amd | intel
	Model         string `json:"model,omitempty"`
	MemoryMiB     int    `json:"memory_mib,omitempty"`
	DriverVersion string `json:"driver_version,omitempty"`
	UUID          string `json:"uuid,omitempty"`
	Index         *int   `json:"index,omitempty"` // nvidia-smi/NVML index
	DetailSource  string `json:"detail_source,omitempty"`
}

// FabricDevice is a Mellanox (NVIDIA networking) physical function with its
// SR-IOV virtual functions and net interfaces.
type FabricDevice struct {
	PCIFunction
	SRIOVTotalVFs int               `json:"sriov_total_vfs"`
	SRIOVNumVFs   int               `json:"sriov_num_vfs"`
	VFs           []VirtualFunction `json:"vfs"`
	Interfaces    []NIC             `json:"interfaces"`
}

// VirtualFunction is one SR-IOV VF of a physical function.
type VirtualFunction struct {
	Index      int    `json:"index"` // N of virtfnN
	Address    string `json:"pci_address"`
	Driver     string `json:"driver,omitempty"`
	IOMMUGroup *int   `json:"iommu_group"`
}

// NVMeNamespace is one NVMe namespace block device. ByIDPath is the stable
// /dev/disk/by-id link to it (empty when udev made none).
type NVMeNamespace struct {
	Name       string   `json:"name"`       // "nvme0n1"
	Controller string   `json:"controller"` // "nvme0"
	Path       string   `json:"path"`       // "/dev/nvme0n1"
	ByIDPath   string   `json:"by_id_path,omitempty"`
	ByIDLinks  []string `json:"by_id_links,omitempty"` // every by-id link, sorted
	SizeBytes  uint64   `json:"size_bytes"`
	Model      string   `json:"model,omitempty"`
	Serial     string   `json:"serial,omitempty"`
	PCIAddress string   `json:"pci_address,omitempty"`
	NUMANode   int      `json:"numa_node"`
	IOMMUGroup *int     `json:"iommu_group"`
	// MountPoints of the namespace and its partitions; Holders are
	// device-mapper/md devices stacked on it. Either means it is in use.
	MountPoints []string `json:"mount_points"`
	Holders     []string `json:"holders"`
}

// IOMMUGroup is one group under /sys/kernel/iommu_groups.
type IOMMUGroup struct {
	ID      int      `json:"id"`
	Devices []string `json:"devices"` // PCI addresses, sorted
}

// InventoryWarning explains a section the agent could only partly read.
type InventoryWarning struct {
	Section string `json:"section"` // e.g. "pci_ids", "gpus", "filesystems"
	Message string `json:"message"`
}

// Capabilities summarises the inventory as enrolment capabilities. Disk is
// the filesystem holding diskPath (the longest mount point that prefixes
// it); CPUCores counts logical CPUs, as schedulers count vCPUs.
func (h HostInventory) Capabilities(diskPath string) Capabilities {
	c := Capabilities{
		Hostname:      h.Hostname,
		OSFamily:      h.OS.Family,
		Arch:          h.OS.Arch,
		KernelVersion: h.OS.KernelVersion,
		CPUCores:      h.CPU.Threads,
		RAMTotalMB:    h.Memory.TotalMiB,
		GPUCount:      len(h.GPUs),
	}
	best := -1
	for i, fs := range h.Filesystems {
		if pathUnder(diskPath, fs.MountPoint) && (best < 0 || len(fs.MountPoint) > len(h.Filesystems[best].MountPoint)) {
			best = i
		}
	}
	if best >= 0 {
		c.DiskTotalGB = int(h.Filesystems[best].TotalBytes >> 30)
	}
	return c
}

// pathUnder reports whether p is mount or below it. "/" holds every POSIX
// path; Windows drive mounts ("C:\\") compare case-insensitively.
func pathUnder(p, mount string) bool {
	if mount == "" || len(p) < len(mount) {
		return false
	}
	head := p[:len(mount)]
	if len(mount) >= 2 && mount[1] == ':' {
		if !strings.EqualFold(head, mount) {
			return false
		}
	} else if head != mount {
		return false
	}
	if len(p) == len(mount) {
		return true
	}
	last := mount[len(mount)-1]
	return last == '/' || last == '\\' || p[len(mount)] == '/' || p[len(mount)] == '\\'
}
