package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/slice"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// approveDiscovered enrols hostID, answers a slice.topology_discover task
// with cands as its candidate slots (as the host's agent would), and
// approves them all through the operator API ("slot-<index>").
func (e *env) approveDiscovered(hostID string, cands ...slice.CandidateSlot) {
	e.t.Helper()
	n := e.enroll(hostID, e.createHost(hostID).Token)
	disc := e.enqueue(hostID, task.TypeTopologyDiscover, map[string]any{})
	if st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath(hostID, "/tasks/wait?timeout=2s"), nil); st != http.StatusOK {
		e.t.Fatalf("claim discovery on %s: %d %s", hostID, st, body)
	}
	out, _ := json.Marshal(map[string]any{"approval_required": true, "candidate_slots": cands,
		"candidate_summary": slice.CandidateSummary{SlotCount: len(cands), SchedulableSlots: len(cands), HostReady: true}})
	res := api.TaskResult{Status: api.ResultSucceeded, Output: out, CorrelationID: disc.CorrelationID, FinishedAt: time.Now().UTC()}
	if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath(hostID, "/tasks/"+disc.ID+"/result"), res); st != http.StatusOK {
		e.t.Fatalf("post discovery result on %s: %d %s", hostID, st, body)
	}
	var slots []api.Slot
	if st := e.op(http.MethodPost, "/api/v1/hosts/"+hostID+"/slots", api.ApproveSlotsRequest{TaskID: disc.ID, All: true}, &slots); st != http.StatusOK || len(slots) != len(cands) {
		e.t.Fatalf("approve slots of %s: %d %+v", hostID, st, slots)
	}
}

// queued counts the tasks of type typ queued for node.
func (e *env) queued(node, typ string) int {
	e.t.Helper()
	var ts []api.Task
	if st := e.op(http.MethodGet, "/api/v1/tasks?limit=1000&node_id="+node, nil, &ts); st != http.StatusOK {
		e.t.Fatalf("list tasks of %s: HTTP %d", node, st)
	}
	n := 0
	for _, t := range ts {
		if t.Type == typ {
			n++
		}
	}
	return n
}

func strp(s string) *string { return &s }

// TestSlotTasksNameApprovedSlots: the control plane signs a
// slice.vm_provision (or a slice.vm_release naming devices) only when every
// slot it names is an approved slot of its node with that slot's devices.
// An operator cannot make a node bind, rebind or wipe a GPU, fabric VF or
// NVMe namespace nobody approved for it: such a task is refused with 422
// naming the param, and nothing is queued.
func TestSlotTasksNameApprovedSlots(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	// gpu-01: slot-0 with a fabric VF and an NVMe namespace, slot-1 with
	// neither. Its boot disk (nvme0n1) and its third GPU were never
	// candidates. gpu-02's slot-0 has a GPU of its own.
	e.approveDiscovered("gpu-01",
		slice.CandidateSlot{SlotIndex: 0, PCIAddress: "0000:17:00.0", FabricDevice: strp("0000:18:00.1"),
			NVMeDevice: strp("/dev/disk/by-id/nvme-Samsung_S1"), MACAddress: "02:00:00:00:00:0a", PrivateIP: strp("10.77.0.10")},
		slice.CandidateSlot{SlotIndex: 1, PCIAddress: "0000:65:00.0", NUMANode: 1, MACAddress: "02:00:00:00:00:0b"})
	e.approveDiscovered("gpu-02", slice.CandidateSlot{SlotIndex: 0, PCIAddress: "0000:3b:00.0"})
	e.approveDiscovered("gpu-03", slice.CandidateSlot{SlotIndex: 2, PCIAddress: "0000:b1:00.0"})

	slot0 := map[string]any{"slot_id": "slot-0", "slot_index": 0, "pci_address": "0000:17:00.0",
		"fabric_device": "0000:18:00.1", "nvme_device": "/dev/disk/by-id/nvme-Samsung_S1"}
	slot1 := map[string]any{"slot_id": "slot-1", "slot_index": 1, "pci_address": "0000:65:00.0"}
	with := func(base map[string]any, kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(m, kv[i].(string))
			} else {
				m[kv[i].(string)] = kv[i+1]
			}
		}
		return m
	}
	provision := func(slots ...map[string]any) map[string]any {
		return map[string]any{"allocation_id": "alloc-1", "vm_name": "slice-a", "image_path": "/var/lib/drover/images/u.img",
			"image_sha256": strings.Repeat("ab", 32), "slots": slots}
	}
	release := func(wipe bool, slots ...map[string]any) map[string]any {
		return map[string]any{"vm_name": "slice-a", "wipe": wipe, "slots": slots}
	}
	tests := []struct {
		name   string
		node   string
		typ    string
		params map[string]any
		field  string // "" → queued
		msg    string // the field error's message contains this
	}{
		{"approved slots", "gpu-01", task.TypeVMProvision, provision(slot0, slot1), "", ""},
		{"approved slot, some devices left out", "gpu-01", task.TypeVMProvision,
			provision(with(slot0, "fabric_device", nil, "nvme_device", nil)), "", ""},
		{"unapproved slot id", "gpu-01", task.TypeVMProvision,
			provision(slot0, with(slot1, "slot_id", "slot-7", "slot_index", 7)),
			"params.slots[1].slot_id", "not an approved slot of host gpu-01"},
		{"a GPU nobody approved", "gpu-01", task.TypeVMProvision, provision(with(slot0, "pci_address", "0000:ca:00.0")),
			"params.slots[0].pci_address", "0000:ca:00.0 is not a device of approved slot slot-0 on host gpu-01 (its GPU is 0000:17:00.0)"},
		{"another approved slot's GPU", "gpu-01", task.TypeVMProvision,
			provision(with(slot0, "pci_address", "0000:65:00.0")),
			"params.slots[0].pci_address", "0000:65:00.0 is not a device of approved slot slot-0 on host gpu-01"},
		{"the host's own NVMe", "gpu-01", task.TypeVMProvision, provision(with(slot0, "nvme_device", "/dev/nvme0n1")),
			"params.slots[0].nvme_device", "/dev/nvme0n1 is not a device of approved slot slot-0 on host gpu-01"},
		{"another fabric VF", "gpu-01", task.TypeVMProvision, provision(with(slot0, "fabric_device", "0000:18:00.2")),
			"params.slots[0].fabric_device", "0000:18:00.2 is not a device of approved slot slot-0"},
		{"a fabric VF on a slot without one", "gpu-01", task.TypeVMProvision,
			provision(with(slot1, "fabric_device", "0000:18:00.1")),
			"params.slots[0].fabric_device", "0000:18:00.1 is not a device of approved slot slot-1 on host gpu-01 (it has no fabric VF)"},
		{"an NVMe on a slot without one", "gpu-01", task.TypeVMProvision,
			provision(with(slot1, "nvme_device", "/dev/disk/by-id/nvme-Samsung_S1")),
			"params.slots[0].nvme_device", "(it has no NVMe namespace)"},
		{"slot approved on another host", "gpu-01", task.TypeVMProvision,
			provision(map[string]any{"slot_id": "slot-2", "slot_index": 2, "pci_address": "0000:b1:00.0"}),
			"params.slots[0].slot_id", "not an approved slot of host gpu-01"},
		{"another host's slot id with its GPU", "gpu-02", task.TypeVMProvision,
			provision(with(slot0, "fabric_device", nil, "nvme_device", nil)),
			"params.slots[0].pci_address", "0000:17:00.0 is not a device of approved slot slot-0 on host gpu-02 (its GPU is 0000:3b:00.0)"},
		{"release by slot id only", "gpu-01", task.TypeVMRelease, release(true, map[string]any{"slot_id": "slot-9"}), "", ""},
		{"release naming approved devices", "gpu-01", task.TypeVMRelease,
			release(true, map[string]any{"slot_id": "slot-0", "pci_address": "0000:17:00.0", "nvme_device": "/dev/disk/by-id/nvme-Samsung_S1"}), "", ""},
		{"release wiping the host's NVMe", "gpu-01", task.TypeVMRelease,
			release(true, map[string]any{"slot_id": "slot-0", "nvme_device": "/dev/nvme0n1"}),
			"params.slots[0].nvme_device", "/dev/nvme0n1 is not a device of approved slot slot-0 on host gpu-01"},
		{"release rebinding an unapproved slot's GPU", "gpu-01", task.TypeVMRelease,
			release(false, map[string]any{"slot_id": "slot-host", "pci_address": "0000:ca:00.0"}),
			"params.slots[0].slot_id", "not an approved slot of host gpu-01"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.queued(tc.node, tc.typ)
			raw, _ := json.Marshal(tc.params)
			var body json.RawMessage
			st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: tc.node, Type: tc.typ, Params: raw}, &body)
			if tc.field == "" {
				if st != http.StatusCreated {
					t.Fatalf("HTTP %d %s, want 201", st, body)
				}
				if got := e.queued(tc.node, tc.typ); got != before+1 {
					t.Errorf("%d %s tasks queued, want %d", got, tc.typ, before+1)
				}
				return
			}
			var eb api.ErrorBody
			_ = json.Unmarshal(body, &eb)
			if st != http.StatusUnprocessableEntity || len(eb.Error.Fields) != 1 || eb.Error.Fields[0].Field != tc.field ||
				!strings.Contains(eb.Error.Fields[0].Message, tc.msg) {
				t.Fatalf("HTTP %d %s, want 422 with %s: ...%s...", st, body, tc.field, tc.msg)
			}
			if got := e.queued(tc.node, tc.typ); got != before {
				t.Errorf("%d %s tasks queued after a refusal, want %d", got, tc.typ, before)
			}
		})
	}

	// An approval deleted is an approval no more.
	if st := e.op(http.MethodDelete, "/api/v1/hosts/gpu-01/slots/slot-0", nil, nil); st != http.StatusNoContent {
		t.Fatalf("delete slot-0: HTTP %d", st)
	}
	before := e.queued("gpu-01", task.TypeVMProvision)
	raw, _ := json.Marshal(provision(slot0))
	var eb api.ErrorBody
	st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: "gpu-01", Type: task.TypeVMProvision, Params: raw}, &eb)
	if st != http.StatusUnprocessableEntity || len(eb.Error.Fields) != 1 ||
		eb.Error.Fields[0] != (api.FieldError{Field: "params.slots[0].slot_id", Message: "not an approved slot of host gpu-01"}) {
		t.Fatalf("provision on a deleted approval: HTTP %d %+v, want 422 on params.slots[0].slot_id", st, eb)
	}
	if got := e.queued("gpu-01", task.TypeVMProvision); got != before {
		t.Errorf("%d provisions queued after the refusal, want %d", got, before)
	}
	// The VM can still be released: its leases name its devices.
	e.enqueue("gpu-01", task.TypeVMRelease, release(true, map[string]any{"slot_id": "slot-0"}))
}
