package instances

// The control plane's half of the slice device rule: a slice task may name
// only devices of slots an operator approved for its node. The agent checks
// the other half (internal/node/slicevm: devices of its own discovered
// topology), which it can know without the approval list.

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// approvedSlot is what a slice task's slot may name: the devices of the
// approved candidate as discovered (its stored spec, internal/node/slice's
// CandidateSlot).
type approvedSlot struct {
	PCIAddress   string  `json:"pci_address"`
	FabricDevice *string `json:"fabric_device"`
	NVMeDevice   *string `json:"nvme_device"`
}

// namedSlot is one slot of a slice task's params as the rule sees it: its
// index in params.slots, its id and the devices it names ("" for none).
type namedSlot struct {
	i                     int
	id, gpu, fabric, nvme string
}

// SliceSlotFields checks the slots a slice.vm_provision or slice.vm_release
// names against nodeID's approved slots: each slot id must be an approved
// slot of nodeID, and each device it names must be that slot's device in
// the same role (GPU, fabric VF, NVMe namespace: the stored candidate's
// values, compared as strings). A release slot that names no device is not
// checked: the agent takes its devices from the VM's leases, which a
// checked provision wrote, so a VM can be released after its approval is
// deleted. params must already be valid for typ; other task types have no
// slots and get nil.
func (s *Room) SliceSlotFields(ctx context.Context, nodeID, typ string, params json.RawMessage) ([]api.FieldError, error) {
	var named []namedSlot
	switch typ {
	case task.TypeVMProvision:
		p, fe := task.DecodeVMProvisionParams(params)
		if fe != nil {
			return fe, nil
		}
		for i, sl := range p.Slots {
			named = append(named, namedSlot{i, sl.SlotID, sl.PCIAddress, sl.FabricDevice, sl.NVMeDevice})
		}
	case task.TypeVMRelease:
		p, fe := task.DecodeVMReleaseParams(params)
		if fe != nil {
			return fe, nil
		}
		for i, sl := range p.Slots {
			if sl.PCIAddress != "" || sl.FabricDevice != "" || sl.NVMeDevice != "" {
				named = append(named, namedSlot{i, sl.SlotID, sl.PCIAddress, sl.FabricDevice, sl.NVMeDevice})
			}
		}
	}
	if len(named) == 0 {
		return nil, nil
	}
	stored, err := s.store.ListSlots(ctx, nodeID)
	if err != nil {
		return nil, fmt.Errorf("approved slots of %s: %w", nodeID, err)
	}
	approved := make(map[string]approvedSlot, len(stored))
	for _, sl := range stored {
		var a approvedSlot // no spec: no devices, so every device named is refused
		if len(sl.Spec) > 0 {
			if err := json.Unmarshal(sl.Spec, &a); err != nil {
				return nil, fmt.Errorf("approved slot %s/%s: decode spec: %w", nodeID, sl.SlotID, err)
			}
		}
		approved[sl.SlotID] = a
	}
	var fields []api.FieldError
	for _, n := range named {
		field := func(name string) string { return fmt.Sprintf("params.slots[%d].%s", n.i, name) }
		a, ok := approved[n.id]
		if !ok {
			fields = append(fields, api.FieldError{Field: field("slot_id"),
				Message: fmt.Sprintf("not an approved slot of host %s", nodeID)})
			continue
		}
		for _, d := range []struct{ name, role, got, want string }{
			{"pci_address", "GPU", n.gpu, a.PCIAddress},
			{"fabric_device", "fabric VF", n.fabric, deref(a.FabricDevice)},
			{"nvme_device", "NVMe namespace", n.nvme, deref(a.NVMeDevice)},
		} {
			if d.got == "" || d.got == d.want {
				continue
			}
			its := fmt.Sprintf("its %s is %s", d.role, d.want)
			if d.want == "" {
				its = "it has no " + d.role
			}
			fields = append(fields, api.FieldError{Field: field(d.name),
				Message: fmt.Sprintf("%s is not a device of approved slot %s on host %s (%s)", d.got, n.id, nodeID, its)})
		}
	}
	return fields, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
