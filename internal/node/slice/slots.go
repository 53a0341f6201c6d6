package slice

// Candidate slots: each GPU paired with a free NVMe namespace and a fabric
// VF, same NUMA node first; deterministic MAC and private IP per slot.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// FirstHostOffset is the host part of slot 0's private IP (.10 in a /24).
const FirstHostOffset = 10

// SlotMAC derives a slot's MAC address from the host id and slot index: a
// locally administered unicast address (02:...) from SHA-256, stable across
// runs and distinct across hosts.
func SlotMAC(hostID string, index int) string {
	sum := sha256.Sum256([]byte("drover-slice/" + hostID + "/" + strconv.Itoa(index)))
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3], sum[4])
}

// SlotIP is the network address + FirstHostOffset + index; false when that
// passes the last usable address of prefix.
func SlotIP(prefix netip.Prefix, index int) (netip.Addr, bool) {
	p := prefix.Masked()
	if !p.Addr().Is4() || index < 0 {
		return netip.Addr{}, false
	}
	size := uint64(1) << (32 - p.Bits())
	off := uint64(FirstHostOffset + index)
	if off >= size-1 { // the last address is the broadcast address
		return netip.Addr{}, false
	}
	a := p.Addr().As4()
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], binary.BigEndian.Uint32(a[:])+uint32(off))
	return netip.AddrFrom4(out), true
}

// pairByNUMA gives each GPU (by NUMA node) at most one candidate (by NUMA
// node), in order: first every GPU takes the first free candidate on its
// own node, then GPUs still without one take the first free candidate on
// any node. -1 means none was left.
func pairByNUMA(gpus, cands []int) []int {
	out := make([]int, len(gpus))
	used := make([]bool, len(cands))
	for i := range out {
		out[i] = -1
	}
	for pass := 0; pass < 2; pass++ {
		for i, g := range gpus {
			if out[i] >= 0 {
				continue
			}
			for j, c := range cands {
				if !used[j] && (pass == 1 || c == g) {
					out[i], used[j] = j, true
					break
				}
			}
		}
	}
	return out
}

// vfRef is one fabric VF in the candidate pool.
type vfRef struct {
	addr string
	numa int
}

func (d *Discoverer) slots(_ context.Context, s *scan) error {
	prefix, err := netip.ParsePrefix(s.params.PrivateCIDR)
	if err != nil {
		return fmt.Errorf("private_cidr %q: %w", s.params.PrivateCIDR, err)
	}
	topo := &s.topo
	sortNVMe(topo.NVMeDevices)
	gpuNUMA := make([]int, len(topo.GPUDevices))
	for i, g := range topo.GPUDevices {
		gpuNUMA[i] = g.NUMANode
	}
	var free []NVMeDevice
	var inUse []string
	for _, n := range topo.NVMeDevices {
		if n.InUse {
			inUse = append(inUse, describeInUse(n))
			continue
		}
		free = append(free, n)
	}
	freeNUMA := make([]int, len(free))
	for i, n := range free {
		freeNUMA[i] = n.NUMANode
	}
	var vfs []vfRef
	vfsEnabled := 0
	for _, f := range topo.FabricDevices {
		vfsEnabled += len(f.VFs)
		for _, v := range f.VFs {
			vfs = append(vfs, vfRef{addr: v.PCIAddress, numa: v.NUMANode})
		}
	}
	vfNUMA := make([]int, len(vfs))
	for i, v := range vfs {
		vfNUMA[i] = v.numa
	}
	nvmeFor, vfFor := pairByNUMA(gpuNUMA, freeNUMA), pairByNUMA(gpuNUMA, vfNUMA)
	groupDevices := map[string]bool{}
	perSlot := make([][]Blocker, len(topo.GPUDevices))
	for i, g := range topo.GPUDevices {
		idx := i
		slot := CandidateSlot{SlotIndex: i, PCIAddress: g.PCIAddress, NUMANode: g.NUMANode,
			MACAddress: SlotMAC(topo.HostID, i)}
		block := func(code, msg string) {
			perSlot[i] = append(perSlot[i], Blocker{Code: code, Message: msg, SlotIndex: &idx})
		}
		var mismatch []string
		if j := nvmeFor[i]; j >= 0 {
			n := free[j]
			dev := n.ByIDPath
			if dev == "" {
				dev = n.Path
				block(BlockerNVMeByIDMissing, fmt.Sprintf("%s has no /dev/disk/by-id link: check udev before using it as a boot disk", n.Name))
			}
			numa := n.NUMANode
			slot.NVMeDevice, slot.NVMeNUMA = &dev, &numa
			if numa >= 0 && g.NUMANode >= 0 && numa != g.NUMANode {
				mismatch = append(mismatch, fmt.Sprintf("NVMe %s is on node %d", n.Name, numa))
			}
		} else if len(inUse) > 0 && s.mountOK {
			block(BlockerNVMeMounted, "no free NVMe namespace for this slot; in use: "+strings.Join(inUse, ", "))
		} else {
			block(BlockerNVMeUnavailable, fmt.Sprintf("no free NVMe namespace for this slot (%d free for %d GPUs)",
				len(free), len(topo.GPUDevices)))
		}
		if j := vfFor[i]; j >= 0 {
			v := vfs[j]
			numa := v.numa
			slot.FabricDevice, slot.FabricNUMA = &v.addr, &numa
			if numa >= 0 && g.NUMANode >= 0 && numa != g.NUMANode {
				mismatch = append(mismatch, fmt.Sprintf("fabric VF %s is on node %d", v.addr, numa))
			}
		} else if len(topo.FabricDevices) > 0 {
			block(BlockerFabricVFUnavailable, fmt.Sprintf(
				"no free SR-IOV VF for this slot (%d VFs enabled on %d Mellanox PFs for %d GPUs): raise sriov_numvfs on a PF, e.g. echo %d > /sys/bus/pci/devices/%s/sriov_numvfs",
				vfsEnabled, len(topo.FabricDevices), len(topo.GPUDevices), suggestedVFs(topo), topo.FabricDevices[0].PCIAddress))
		}
		if len(mismatch) > 0 {
			block(BlockerGPUNUMAMismatch, fmt.Sprintf("GPU %s is on NUMA node %d but %s", g.PCIAddress, g.NUMANode,
				strings.Join(mismatch, " and ")))
		}
		if foreign := foreignGroupMembers(g, s); len(foreign) > 0 {
			block(BlockerGPUIOMMUGroupShared, fmt.Sprintf("IOMMU group %d also holds %s, which would pass through with the GPU: enable ACS or use another slot",
				*g.IOMMUGroup, strings.Join(foreign, ", ")))
		}
		for _, m := range g.IOMMUGroupDevices {
			groupDevices[m] = true
		}
		if ip, ok := SlotIP(prefix, i); ok {
			str := ip.String()
			slot.PrivateIP = &str
		} else {
			block(BlockerPrivateIPExhausted, fmt.Sprintf("%s has no address for slot %d (.%d + index): use a larger private_cidr",
				prefix, i, FirstHostOffset))
		}
		slot.Schedulable = len(perSlot[i]) == 0 && len(s.host) == 0
		topo.CandidateSlots = append(topo.CandidateSlots, slot)
	}
	topo.CandidateSummary = summarize(s.host, perSlot, topo.CandidateSlots, s.notices)
	return nil
}

// foreignGroupMembers are the devices in g's IOMMU group that are neither
// functions of the GPU's own card nor PCI bridges.
func foreignGroupMembers(g GPUDevice, s *scan) []string {
	if g.IOMMUGroup == nil {
		return nil
	}
	gpu := s.byAddr[g.PCIAddress]
	var out []string
	for _, m := range g.IOMMUGroupDevices {
		fn, ok := s.byAddr[m]
		if m == g.PCIAddress || (ok && (fn.Slot() == gpu.Slot() || fn.IsBridge())) {
			continue
		}
		out = append(out, m)
	}
	return out
}

// suggestedVFs is enough VFs per PF for one per GPU, within what a PF allows.
func suggestedVFs(topo *Topology) int {
	pfs := len(topo.FabricDevices)
	n := (len(topo.GPUDevices) + pfs - 1) / pfs
	if t := topo.FabricDevices[0].SRIOVTotalVFs; t > 0 && n > t {
		n = t
	}
	return n
}

func describeInUse(n NVMeDevice) string {
	var why []string
	for _, m := range n.MountPoints {
		why = append(why, "mounted at "+m)
	}
	for _, h := range n.Holders {
		why = append(why, "held by "+h)
	}
	if len(why) == 0 {
		why = append(why, "mount state unknown")
	}
	return n.Name + " (" + strings.Join(why, ", ") + ")"
}

// sortNVMe orders namespaces naturally: nvme2n1 before nvme10n1.
func sortNVMe(ns []NVMeDevice) {
	key := func(name string) (int, int) {
		c, n, _ := strings.Cut(strings.TrimPrefix(name, "nvme"), "n")
		ci, _ := strconv.Atoi(c)
		ni, _ := strconv.Atoi(n)
		return ci, ni
	}
	sort.SliceStable(ns, func(i, j int) bool {
		ci, ni := key(ns[i].Name)
		cj, nj := key(ns[j].Name)
		if ci != cj {
			return ci < cj
		}
		return ni < nj
	})
}

// summarize lists host-wide blockers, then each slot's in slot order,
// and the notices.
func summarize(host []Blocker, perSlot [][]Blocker, slots []CandidateSlot, notices []Blocker) CandidateSummary {
	sum := CandidateSummary{SlotCount: len(slots), HostReady: len(host) == 0, Blockers: []Blocker{},
		Notices: append([]Blocker{}, notices...)}
	sum.Blockers = append(sum.Blockers, host...)
	for _, b := range perSlot {
		sum.Blockers = append(sum.Blockers, b...)
	}
	for _, s := range slots {
		if s.Schedulable {
			sum.SchedulableSlots++
		}
	}
	return sum
}
