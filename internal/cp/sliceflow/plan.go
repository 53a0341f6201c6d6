package sliceflow

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// plan is what lease_slots decided (stored as the workflow's Plan): the
// VM's name, the leased slots with their full slice.vm_provision
// parameters, and how they sit on NUMA nodes.
type plan struct {
	VMName string        `json:"vm_name"`
	NUMA   string        `json:"numa"`
	Slots  []task.VMSlot `json:"slots"`
	// OVSBridge is the host's slice network bridge the VM's tap goes on
	// (sliceNetwork); empty: user-mode networking.
	OVSBridge string `json:"ovs_bridge,omitempty"`
}

// slotSpec is what the workflow reads of an approved slot's stored spec
// (the discovered candidate).
type slotSpec struct {
	PCIAddress   string  `json:"pci_address"`
	NUMANode     *int    `json:"numa_node"`
	FabricDevice *string `json:"fabric_device"`
	NVMeDevice   *string `json:"nvme_device"`
	MACAddress   string  `json:"mac_address"`
	PrivateIP    *string `json:"private_ip"`
}

// freeSlot is an approved slot that no other allocation holds.
type freeSlot struct {
	store.Slot
	spec slotSpec
	mine bool // already leased to this allocation (a resumed lease_slots)
}

func cidOf(ctx context.Context, id string) string {
	if c := httpapi.CorrelationID(ctx); c != "" {
		return c
	}
	return "slice-" + id
}

// vmName is the VM's name for an allocation: its id, lower case, as a
// runtime id.
func vmName(allocationID string) string {
	b := []byte(strings.ToLower(allocationID))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	n := "slice-" + string(b)
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// Validate checks a slice allocation request without the store: the
// fields slice.vm_provision would refuse are named as request fields.
func Validate(req api.CreateAllocationRequest) []api.FieldError {
	var fe []api.FieldError
	if req.InstanceID != "" {
		fe = append(fe, api.FieldError{Field: "instance_id", Message: "a slice allocation gets its own VM; leave instance_id out"})
	}
	if req.Slots < 1 || req.Slots > task.MaxVMSlots {
		fe = append(fe, api.FieldError{Field: "slots", Message: fmt.Sprintf("must be between 1 and %d", task.MaxVMSlots)})
	}
	if req.Shell != "" {
		// The shell goes to provision_user's allocation.provision_user in
		// the guest (sudo too).
		raw, _ := json.Marshal(task.AllocProvisionUserParams{AllocationID: "alc_check", Username: "check", Shell: req.Shell})
		if _, ufe := task.DecodeAllocProvisionUserParams(raw); len(ufe) > 0 {
			fe = append(fe, api.FieldError{Field: "shell", Message: ufe[0].Message})
		}
	}
	if req.Username == "" {
		fe = append(fe, api.FieldError{Field: "username", Message: "is required"})
	}
	p := task.VMProvisionParams{AllocationID: "alc_check", VMName: "check", ImageURL: req.Image, ImageSHA256: req.ImageSHA256,
		DefaultUsername: req.Username, SSHPublicKeys: req.SSHAuthorizedKeys, Boot: req.Boot,
		ReadinessMarker: req.ReadinessMarker, ReadinessTimeoutSeconds: req.ReadinessTimeoutSeconds,
		Slots: []task.VMSlot{{SlotID: "s0", PCIAddress: "0000:00:00.0", VCPUCount: req.VCPUs, MemoryMiB: req.MemoryMiB}}}
	raw, _ := json.Marshal(p)
	_, pfe := task.DecodeVMProvisionParams(raw)
	rename := map[string]string{"image_url": "image", "image_path": "image", "default_username": "username",
		"slots[0].vcpu_count": "vcpus", "slots[0].memory_mib": "memory_mib"}
	for _, f := range pfe {
		name := strings.TrimPrefix(f.Field, "params.")
		if n, ok := rename[name]; ok {
			name = n
		} else if rest, ok := strings.CutPrefix(name, "ssh_public_keys"); ok {
			name = "ssh_authorized_keys" + rest
		}
		if name == "username" && req.Username == "" {
			continue
		}
		fe = append(fe, api.FieldError{Field: name, Message: f.Message})
	}
	return fe
}

// freeSlots lists hostID's approved slots no other allocation leased.
func (s *Room) freeSlots(ctx context.Context, hostID, allocationID string) ([]freeSlot, error) {
	slots, err := s.store.ListSlots(ctx, hostID)
	if err != nil {
		return nil, err
	}
	leases, err := s.store.ListSlotLeases(ctx, hostID)
	if err != nil {
		return nil, err
	}
	held := map[string]string{}
	for _, l := range leases {
		held[l.SlotID] = l.AllocationID
	}
	var out []freeSlot
	for _, sl := range slots {
		h, leased := held[sl.SlotID]
		if leased && h != allocationID {
			continue
		}
		f := freeSlot{Slot: sl, mine: leased}
		if len(sl.Spec) > 0 {
			if err := json.Unmarshal(sl.Spec, &f.spec); err != nil {
				return nil, fmt.Errorf("approved slot %s/%s: decode spec: %w", hostID, sl.SlotID, err)
			}
		}
		if f.spec.PCIAddress == "" {
			continue // no GPU recorded: not a slot slice.vm_provision can pass through
		}
		out = append(out, f)
	}
	return out, nil
}

// Place picks the host of a slice allocation: hostID when given (it must
// exist), else the first enabled, unrevoked, undrained host (by id) with n
// free approved slots. ok is false when none has them.
func (s *Room) Place(ctx context.Context, hostID string, n int) (string, bool, error) {
	var hosts []store.Host
	if hostID != "" {
		h, err := s.store.GetHost(ctx, hostID)
		if err != nil {
			return "", false, err
		}
		hosts = []store.Host{h}
	} else {
		all, err := s.store.ListHosts(ctx)
		if err != nil {
			return "", false, err
		}
		for _, h := range all {
			if h.Enabled && !h.Revoked && !h.Draining {
				hosts = append(hosts, h)
			}
		}
	}
	for _, h := range hosts {
		free, err := s.freeSlots(ctx, h.ID, "")
		if err != nil {
			return "", false, err
		}
		if len(free) >= n {
			return h.ID, true, nil
		}
	}
	return "", false, nil
}

// choose picks n of free: slots this allocation already holds first (a
// resumed lease), then all on one NUMA node when one node has n free (the
// node with the fewest free that still fits, keeping larger nodes whole),
// else the lowest indexes. numa says which it did.
func choose(free []freeSlot, n int) (picked []freeSlot, numa string) {
	sort.SliceStable(free, func(i, j int) bool { return free[i].Index < free[j].Index })
	var mine []freeSlot
	for _, f := range free {
		if f.mine {
			mine = append(mine, f)
		}
	}
	if len(mine) >= n {
		return mine[:n], numaOf(mine[:n])
	}
	byNode := map[int][]freeSlot{}
	known := true
	for _, f := range free {
		if f.spec.NUMANode == nil || *f.spec.NUMANode < 0 {
			known = false
			continue
		}
		byNode[*f.spec.NUMANode] = append(byNode[*f.spec.NUMANode], f)
	}
	if known {
		best := -1
		for node, fs := range byNode {
			if len(fs) >= n && (best < 0 || len(fs) < len(byNode[best]) || len(fs) == len(byNode[best]) && node < best) {
				best = node
			}
		}
		if best >= 0 {
			return byNode[best][:n], fmt.Sprintf("node %d", best)
		}
	}
	if len(free) < n {
		return nil, ""
	}
	return free[:n], numaOf(free[:n])
}

func numaOf(fs []freeSlot) string {
	node := -2
	for _, f := range fs {
		if f.spec.NUMANode == nil || *f.spec.NUMANode < 0 {
			return "unknown"
		}
		if node != -2 && node != *f.spec.NUMANode {
			return "spanning"
		}
		node = *f.spec.NUMANode
	}
	return fmt.Sprintf("node %d", node)
}

// vmSlot is a leased slot's slice.vm_provision parameters: the approved
// devices, the request's share, and the slot's MAC and private IP (the
// discovered ones, which are deterministic, else derived from host and
// slot id).
func vmSlot(hostID string, f freeSlot, req api.CreateAllocationRequest) task.VMSlot {
	vs := task.VMSlot{SlotID: f.SlotID, SlotIndex: f.Index, PCIAddress: f.spec.PCIAddress,
		FabricDevice: deref(f.spec.FabricDevice), NVMeDevice: deref(f.spec.NVMeDevice),
		VCPUCount: req.VCPUs, MemoryMiB: req.MemoryMiB, MACAddress: strings.ToLower(f.spec.MACAddress), PrivateIP: deref(f.spec.PrivateIP)}
	if f.spec.NUMANode != nil {
		vs.NUMANode = *f.spec.NUMANode
	}
	if vs.VCPUCount == 0 {
		vs.VCPUCount = task.DefaultSlotVCPUs
	}
	if vs.MemoryMiB == 0 {
		vs.MemoryMiB = task.DefaultSlotMemoryMiB
	}
	if vs.MACAddress == "" || vs.PrivateIP == "" {
		vs.MACAddress, vs.PrivateIP = DeriveAddress(hostID, f.SlotID)
	}
	return vs
}

// DeriveAddress is a slot's deterministic MAC (locally administered,
// 52:54:00 prefix) and private IP (10.77.0.0/16, never .0 or .255) from
// its host and slot id.
func DeriveAddress(hostID, slotID string) (mac, ip string) {
	h := sha256.Sum256([]byte(hostID + "/" + slotID))
	mac = fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], h[2])
	ip = netip.AddrFrom4([4]byte{10, 77, h[3], 1 + h[4]%254}).String()
	return mac, ip
}

// sliceNetwork picks the VM's network: the bridge of the slice network
// the host's agent reports serving (its capabilities' slice_network) when
// every slot's private IP lies inside that network and is none of its
// network, gateway (first) or broadcast addresses; else "" (user-mode
// networking). why says which, for the step's detail.
func sliceNetwork(h store.Host, slots []task.VMSlot) (bridge, why string) {
	var caps api.Capabilities
	if len(h.Capabilities) == 0 || json.Unmarshal(h.Capabilities, &caps) != nil || caps.SliceNetwork == nil {
		return "", "user-mode networking: the host's agent serves no slice network"
	}
	sn := *caps.SliceNetwork
	prefix, err := netip.ParsePrefix(sn.CIDR)
	if err != nil || !prefix.Addr().Is4() || sn.Bridge == "" {
		return "", fmt.Sprintf("user-mode networking: the host's slice network (%q on %q) is not usable", sn.CIDR, sn.Bridge)
	}
	prefix = prefix.Masked()
	for _, sl := range slots {
		ip, err := netip.ParseAddr(sl.PrivateIP)
		if err != nil || !prefix.Contains(ip) || reservedAddr(prefix, ip) {
			return "", fmt.Sprintf("user-mode networking: slot %s's address %q is not a host address of the slice network %s",
				sl.SlotID, sl.PrivateIP, prefix)
		}
	}
	return sn.Bridge, fmt.Sprintf("slice network %s on %s", prefix, sn.Bridge)
}

// reservedAddr is true for prefix's network, gateway (its first host) and
// broadcast addresses.
func reservedAddr(prefix netip.Prefix, ip netip.Addr) bool {
	network := prefix.Addr()
	b := network.As4()
	hostBits := 32 - prefix.Bits()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	bc := n | (uint32(1)<<hostBits - 1)
	a := ip.As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	return v == n || v == n+1 || v == bc
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
