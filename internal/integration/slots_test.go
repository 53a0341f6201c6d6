package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestSlotApproval: candidate slots from a slice.topology_discover result
// become node resource slots only through an operator's approval, and a
// slot with blockers is refused with every blocker named.
func TestSlotApproval(t *testing.T) {
	p := &auditProbe{Store: openSQLite(t)} // each approval and deletion stored with its record
	e := startEnv(t, p)
	n := e.enroll("gpu-1", e.createHost("gpu-1").Token)
	task := e.enqueue("gpu-1", "slice.topology_discover", map[string]any{})
	st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("gpu-1", "/tasks/wait?timeout=2s"), nil)
	if st != http.StatusOK {
		t.Fatalf("claim: %d %s", st, body)
	}
	// The discovery result as an agent on a two-slot host would post it:
	// slot 1 is blocked (its NVMe is mounted).
	output := `{"approval_required":true,
		"candidate_slots":[
			{"slot_index":0,"gpu":{"pci_address":"0000:17:00.0"},"numa_node":0,"mac_address":"02:00:00:00:00:0a","private_ip":"10.77.0.10"},
			{"slot_index":1,"gpu":{"pci_address":"0000:65:00.0"},"numa_node":1,"mac_address":"02:00:00:00:00:0b","private_ip":"10.77.0.11"}],
		"candidate_summary":{"blockers":[{"code":"nvme_mounted","message":"nvme1n1 is mounted at /data","slot_index":1}]}}`
	res := api.TaskResult{Status: api.ResultSucceeded, Output: json.RawMessage(output), CorrelationID: task.CorrelationID,
		FinishedAt: time.Now().UTC()}
	if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("gpu-1", "/tasks/"+task.ID+"/result"), res); st != http.StatusOK {
		t.Fatalf("post result: %d %s", st, body)
	}

	var slots []api.Slot
	if st := e.op(http.MethodGet, "/api/v1/hosts/gpu-1/slots", nil, &slots); st != http.StatusOK || len(slots) != 0 {
		t.Fatalf("slots before approval: %d %+v (discovery must not write slots)", st, slots)
	}
	var eb api.ErrorBody
	st = e.op(http.MethodPost, "/api/v1/hosts/gpu-1/slots", api.ApproveSlotsRequest{TaskID: task.ID, All: true}, &eb)
	if st != http.StatusConflict || eb.Error.Code != "slot_blocked" || !strings.Contains(eb.Error.Message, "slot 1: nvme_mounted") {
		t.Fatalf("approve all: %d %+v, want 409 slot_blocked naming slot 1", st, eb)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/gpu-1/slots", api.ApproveSlotsRequest{TaskID: task.ID, SlotIndexes: []int{0}}, &slots); st != http.StatusOK {
		t.Fatalf("approve slot 0: %d", st)
	}
	if len(slots) != 1 || slots[0].SlotID != "slot-0" || slots[0].SourceTask != task.ID || !strings.Contains(string(slots[0].Spec), "0000:17:00.0") {
		t.Fatalf("approved slots %+v", slots)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/gpu-1/slots", api.ApproveSlotsRequest{TaskID: task.ID, SlotIndexes: []int{0}}, &eb); st != http.StatusConflict {
		t.Fatalf("approving twice: %d, want 409", st)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/gpu-1/slots", api.ApproveSlotsRequest{TaskID: task.ID, SlotIndexes: []int{7}}, &eb); st != http.StatusUnprocessableEntity {
		t.Fatalf("unknown slot index: %d, want 422", st)
	}
	other := e.enqueue("gpu-1", "diag.health_probe", nil)
	if st := e.op(http.MethodPost, "/api/v1/hosts/gpu-1/slots", api.ApproveSlotsRequest{TaskID: other.ID, All: true}, &eb); st != http.StatusUnprocessableEntity {
		t.Fatalf("approving from a non-discovery task: %d, want 422", st)
	}
	if !e.auditHas("slot.approve", "gpu-1/slot-0", "ok") {
		t.Error("approval not audited")
	}
	if st := e.op(http.MethodDelete, "/api/v1/hosts/gpu-1/slots/slot-0", nil, nil); st != http.StatusNoContent {
		t.Fatalf("delete slot: %d", st)
	}
	p.verify(t, 2)
}

// TestTopologyDiscoverOnThisMachine runs the real discovery through a real
// agent on this GPU-less machine: the result says so plainly, with
// blockers, and nothing can be approved.
func TestTopologyDiscoverOnThisMachine(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	bt := e.createHost("plain")
	e.startAgent("plain", bt.Token, agentOpts{})
	task := e.enqueue("plain", "slice.topology_discover", map[string]any{})
	got := e.waitTask(task.ID, 60*time.Second)
	if got.State != api.TaskSucceeded {
		t.Fatalf("discovery: %s %+v", got.State, got.Result)
	}
	var out struct {
		ApprovalRequired bool              `json:"approval_required"`
		GPUDevices       []json.RawMessage `json:"gpu_devices"`
		CandidateSlots   []json.RawMessage `json:"candidate_slots"`
		CandidateSummary struct {
			Blockers []struct {
				Code string `json:"code"`
			} `json:"blockers"`
		} `json:"candidate_summary"`
	}
	if err := json.Unmarshal(got.Result.Output, &out); err != nil {
		t.Fatal(err)
	}
	if !out.ApprovalRequired || out.GPUDevices == nil && !strings.Contains(string(got.Result.Output), `"gpu_devices":[]`) {
		t.Fatalf("output %s", got.Result.Output)
	}
	if len(out.GPUDevices) != 0 || len(out.CandidateSlots) != 0 {
		t.Skipf("this machine has GPUs (%d); the GPU-less assertions do not apply", len(out.GPUDevices))
	}
	found := false
	for _, b := range out.CandidateSummary.Blockers {
		if b.Code == "no_gpus" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no no_gpus blocker in %s", got.Result.Output)
	}
	var eb api.ErrorBody
	if st := e.op(http.MethodPost, "/api/v1/hosts/plain/slots", api.ApproveSlotsRequest{TaskID: task.ID, All: true}, &eb); st != http.StatusConflict {
		t.Fatalf("approving on a GPU-less host: %d %+v, want 409", st, eb)
	}
}
