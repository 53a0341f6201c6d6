package slice

// Fake hosts for the golden tests, built with hostinfotest under
// t.TempDir() (symlinks for iommu_group, virtfn*, physfn, driver, by-id).

import (
	"fmt"
	"strings"

	"github.com/drover-dev/drover/internal/node/hostinfo/hostinfotest"
)

const (
	intelCPUInfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu vmx ept\n"
	amdCPUInfo   = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\nflags\t\t: fpu svm npt\n"
	meminfo      = "MemTotal: 2113126400 kB\nMemFree: 2000000000 kB\nMemAvailable: 2100000000 kB\n"
	swapsHeader  = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
)

// modules renders a /proc/modules listing.
func modules(names ...string) *string {
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s 16384 0 - Live 0x0000000000000000\n", n)
	}
	return hostinfotest.Ptr(b.String())
}

func allModules() *string {
	return modules("vfio_pci", "vfio_iommu_type1", "vfio", "kvm_intel", "kvm", "mlx5_ib", "mlx5_core", "ib_ipoib", "openvswitch")
}

// gpu is an NVIDIA H100 SXM function bound to vfio-pci.
func gpu(addr, numa, group string) hostinfotest.PCI {
	return hostinfotest.PCI{Addr: addr, Vendor: "0x10de", Device: "0x2330", Class: "0x030200", NUMA: numa,
		Driver: "vfio-pci", IOMMUGroup: group}
}

// nvmeCtrl is a Samsung NVMe controller function.
func nvmeCtrl(addr, numa, group string) hostinfotest.PCI {
	return hostinfotest.PCI{Addr: addr, Vendor: "0x144d", Device: "0xa824", Class: "0x010802", NUMA: numa,
		Driver: "nvme", IOMMUGroup: group}
}

// namespace is nvme<n>n1 on ctrlAddr, 3.84 TB, with model_serial and EUI
// by-id links.
func namespace(n int, ctrlAddr string, parts ...string) hostinfotest.Block {
	serial := fmt.Sprintf("S6EUNE0R%06d", n)
	return hostinfotest.Block{Name: fmt.Sprintf("nvme%dn1", n), Controller: fmt.Sprintf("nvme%d", n), PCIAddr: ctrlAddr,
		Sectors: "7501476528", Model: "SAMSUNG MZWLR3T8HBLS-00007", Serial: serial, Rotational: "0", Removable: "0",
		Partitions: parts,
		ByID:       []string{"nvme-SAMSUNG_MZWLR3T8HBLS-00007_" + serial, fmt.Sprintf("nvme-eui.3634473052600%03d0025384500000001", n)}}
}

// mlxPF is a ConnectX-7 InfiniBand PF with vfs VFs at functions .2 onwards
// (IOMMU groups from vfGroup0 up), all bound to vfio-pci.
func mlxPF(addr, numa, group, ifname string, vfGroup0 int, vfs int) []hostinfotest.PCI {
	slot := addr[:len(addr)-2]
	pf := hostinfotest.PCI{Addr: addr, Vendor: "0x15b3", Device: "0x1021", Class: "0x020700", NUMA: numa,
		Driver: "mlx5_core", IOMMUGroup: group, SRIOVTotalVFs: "16", SRIOVNumVFs: fmt.Sprint(vfs),
		Nets: []hostinfotest.Net{{Name: ifname, OperState: "up", Speed: "400000", Type: "32", MTU: "4092"}}}
	out := []hostinfotest.PCI{}
	for i := 0; i < vfs; i++ {
		vf := fmt.Sprintf("%s.%d", slot, i+2)
		pf.VFs = append(pf.VFs, vf)
		out = append(out, hostinfotest.PCI{Addr: vf, Vendor: "0x15b3", Device: "0x101e", Class: "0x020700", NUMA: numa,
			Driver: "vfio-pci", IOMMUGroup: fmt.Sprint(vfGroup0 + i), PhysFn: addr})
	}
	return append([]hostinfotest.PCI{pf}, out...)
}

// ovsBridge is br-slice as Open vSwitch shows it in sysfs.
func ovsBridge() []hostinfotest.Net {
	return []hostinfotest.Net{
		{Name: "br-slice", OperState: "unknown", Address: "02:00:00:00:00:01", MTU: "1500"},
		{Name: "ovs-system", OperState: "down", Address: "02:00:00:00:00:02", MTU: "1500"},
	}
}

// gpuHost8 is an HGX-style host: 8 GPUs, 8 data NVMe namespaces and two
// ConnectX-7 PFs with 4 VFs each, split over NUMA nodes 0 and 1, plus a
// ninth NVMe holding the OS (mounted, never proposed). Everything a slice
// needs is present.
func gpuHost8() hostinfotest.Host {
	h := hostinfotest.Host{
		CPUInfo: intelCPUInfo, Meminfo: meminfo, Modules: allModules(), KVM: true, IPForward: "1",
		Cmdline: "BOOT_IMAGE=/vmlinuz-6.8.0-45-generic root=UUID=0f0e ro intel_iommu=on iommu=pt quiet",
		Mounts: "/dev/nvme8n1p2 / ext4 rw,relatime 0 0\n/dev/nvme8n1p1 /boot/efi vfat rw 0 0\n" +
			"proc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n",
		Virtual: ovsBridge(),
		Files: map[string]string{
			"proc/swaps":                     swapsHeader,
			"root/etc/netplan/60-ipoib.yaml": "network:\n  ethernets:\n    ibp26s0:\n      addresses: [192.168.100.11/24]\n",
		},
	}
	h.PCI = append(h.PCI, hostinfotest.PCI{Addr: "0000:00:00.0", Vendor: "0x8086", Device: "0x09a2", Class: "0x060000", NUMA: "0", IOMMUGroup: "0"})
	gpus := []struct{ addr, numa string }{
		{"0000:18:00.0", "0"}, {"0000:2a:00.0", "0"}, {"0000:3a:00.0", "0"}, {"0000:5d:00.0", "0"},
		{"0000:9a:00.0", "1"}, {"0000:ab:00.0", "1"}, {"0000:ba:00.0", "1"}, {"0000:db:00.0", "1"},
	}
	for i, g := range gpus {
		h.PCI = append(h.PCI, gpu(g.addr, g.numa, fmt.Sprint(20+i)))
		// each GPU sits next to one NVMe controller: 0000:19:00.0, ...
		ctrl := g.addr[:5] + fmt.Sprintf("%02x", mustHex(g.addr[5:7])+1) + ":00.0"
		h.PCI = append(h.PCI, nvmeCtrl(ctrl, g.numa, fmt.Sprint(30+i)))
		h.Block = append(h.Block, namespace(i, ctrl))
	}
	h.PCI = append(h.PCI, nvmeCtrl("0000:05:00.0", "0", "38"))
	h.Block = append(h.Block, namespace(8, "0000:05:00.0", "nvme8n1p1", "nvme8n1p2"))
	h.PCI = append(h.PCI, mlxPF("0000:1a:00.0", "0", "40", "ibp26s0", 41, 4)...)
	h.PCI = append(h.PCI, mlxPF("0000:9c:00.0", "1", "50", "ibp156s0", 51, 4)...)
	return h
}

// iommuOffHost has two GPUs and two NVMe namespaces but no IOMMU: no
// iommu_groups and nothing on the kernel command line.
func iommuOffHost() hostinfotest.Host {
	h := hostinfotest.Host{
		CPUInfo: intelCPUInfo, Meminfo: meminfo, Modules: allModules(), KVM: true, IPForward: "1",
		Cmdline: "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet splash",
		Mounts:  "/dev/sda1 / ext4 rw 0 0\n", Virtual: ovsBridge(),
		Files: map[string]string{"proc/swaps": swapsHeader},
	}
	for i, g := range []struct{ addr, numa string }{{"0000:3b:00.0", "0"}, {"0000:86:00.0", "1"}} {
		p := gpu(g.addr, g.numa, "")
		p.Driver = "nvidia"
		ctrl := g.addr[:5] + fmt.Sprintf("%02x", mustHex(g.addr[5:7])+1) + ":00.0"
		h.PCI = append(h.PCI, p, nvmeCtrl(ctrl, g.numa, ""))
		h.Block = append(h.Block, namespace(i, ctrl))
	}
	return h
}

// bareHost has an AMD GPU and one NVMe, an IOMMU, but no VFIO modules, no
// OVS bridge and several provisioning commands missing.
func bareHost() hostinfotest.Host {
	return hostinfotest.Host{
		CPUInfo: amdCPUInfo, Meminfo: meminfo, Modules: modules("kvm_amd", "kvm", "nvme"), KVM: true, IPForward: "1",
		Cmdline: "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro amd_iommu=on iommu=pt",
		Mounts:  "/dev/sda1 / ext4 rw 0 0\n",
		PCI: []hostinfotest.PCI{
			{Addr: "0000:00:00.0", Vendor: "0x1022", Device: "0x14a4", Class: "0x060000", NUMA: "0", IOMMUGroup: "0"},
			{Addr: "0000:05:00.0", Vendor: "0x1002", Device: "0x74a1", Class: "0x038000", NUMA: "0", Driver: "amdgpu", IOMMUGroup: "5"},
			nvmeCtrl("0000:06:00.0", "0", "6"),
		},
		Block: []hostinfotest.Block{namespace(0, "0000:06:00.0")},
	}
}

// missingCommands is a LookPath that finds everything but the named
// commands, under /usr/bin.
func missingCommands(missing ...string) func(string) (string, error) {
	return func(file string) (string, error) {
		for _, m := range missing {
			if m == file {
				return "", fmt.Errorf("exec: %q: executable file not found in $PATH", file)
			}
		}
		return "/usr/bin/" + file, nil
	}
}

func mustHex(s string) int {
	var n int
	if _, err := fmt.Sscanf(s, "%x", &n); err != nil {
		panic(err)
	}
	return n
}
