package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/sliceflow"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// TestSliceWorkflowTCG is a slice allocation end to end: the operator
// creates it through the API on a host whose GPU/NVMe/fabric topology is a
// fixture tree (discovered by the real slice.topology_discover, approved
// through the operator API)
// and whose NVMe namespace is a file; the control plane's real workflow
// leases the slot, queues slice.vm_provision, awaits it by task event and
// records the result; the real agent boots the guest under QEMU (TCG) from
// the NVMe; the allocation turns active with the VM's address, readiness
// and performance, its progress (steps and phases, with timings) visible
// in the API as `--wait` shows it, live; a brokered terminal runs a
// command in the guest as the allocation's user; the release runs
// slice.vm_release with wipe and leaves no lease, reservation, terminal
// record or VM.
func TestSliceWorkflowTCG(t *testing.T) {
	e := browserEnv(t)
	n := newSliceNode(t, e, "slice-wf")
	slots := n.approveSlots(e)
	const user = "alice"

	a := e.createSlice(n.request(user))
	livePhases := map[string]bool{}
	liveSteps := map[string]bool{}
	a = e.followSlice(a.ID, 6*time.Minute, func(a api.Allocation) {
		if a.State != api.AllocationProvisioning || a.Workflow == nil {
			return
		}
		for _, st := range a.Workflow.Steps {
			liveSteps[st.Step+" "+st.State] = true
		}
		for _, ph := range a.Workflow.Phases {
			livePhases[ph.Phase] = true
		}
	}, settled)
	wf := a.Workflow
	if a.State != api.AllocationActive || wf == nil || wf.Status != "active" {
		raw, _ := json.MarshalIndent(a, "", "  ")
		t.Fatalf("allocation not active:\n%s", raw)
	}
	if !liveSteps[sliceflow.StepAwaitProvision+" started"] || len(livePhases) == 0 {
		t.Errorf("progress was not visible while provisioning: steps %v, phases %v", liveSteps, livePhases)
	}
	var want []string
	var userTask string
	for _, st := range wf.Steps {
		want = append(want, st.Step)
		if st.State != "done" || st.EndedAt == nil || st.DurationMS < 0 || st.IdempotencyKey == "" {
			t.Errorf("step %+v", st)
		}
		if st.Step == sliceflow.StepProvisionUser {
			userTask = st.TaskID
		}
	}
	// provision_user ran allocation.provision_user inside the guest.
	ut := e.waitTask(userTask, 10*time.Second)
	var up task.AllocProvisionUserParams
	var uo struct {
		VMName string `json:"vm_name"`
		User   struct {
			Username string `json:"username"`
			UID      int    `json:"uid"`
			Keys     int    `json:"keys"`
		} `json:"user"`
	}
	if ut.Type != task.TypeAllocProvisionUser || ut.State != api.TaskSucceeded || json.Unmarshal(ut.Params, &up) != nil ||
		up.VMName != wf.VMName || up.Username != user || json.Unmarshal(ut.Result.Output, &uo) != nil ||
		uo.VMName != wf.VMName || uo.User.Username != user || uo.User.UID < 1000 || uo.User.Keys != 1 {
		t.Errorf("provision_user task %s %s %s: params %s, output %s", ut.ID, ut.Type, ut.State, ut.Params, ut.Result.Output)
	}
	if !slices.Equal(want, []string{sliceflow.StepLeaseSlots, sliceflow.StepVMProvision, sliceflow.StepAwaitProvision,
		sliceflow.StepRecordResult, sliceflow.StepProvisionUser, sliceflow.StepActivate}) {
		t.Errorf("steps %v", want)
	}
	var phases []string
	for _, ph := range wf.Phases {
		phases = append(phases, ph.Phase)
	}
	if !slices.Equal(phases, slicevm.ProvisionPhases()) {
		t.Errorf("phases %v, want %v", phases, slicevm.ProvisionPhases())
	}
	var spec struct {
		PrivateIP  string  `json:"private_ip"`
		NVMeDevice *string `json:"nvme_device"`
	}
	_ = json.Unmarshal(slots[0].Spec, &spec)
	vm := wf.VM
	if vm == nil || !vm.Ready || vm.SSHHost != "127.0.0.1" || vm.SSHPort == 0 || vm.DefaultUser != user ||
		vm.RawVNC || vm.ConsoleModel != "gateway_required" || len(vm.Readiness) == 0 || len(vm.Performance) == 0 ||
		len(vm.Timings) == 0 {
		t.Fatalf("vm %+v", vm)
	}
	if len(wf.Slots) != 1 || wf.Slots[0].SlotID != slots[0].SlotID || wf.Slots[0].PCIAddress != sliceGPU ||
		wf.Slots[0].FabricDevice != sliceVF || wf.Slots[0].PrivateIP != spec.PrivateIP || spec.NVMeDevice == nil ||
		wf.Slots[0].NVMeDevice != *spec.NVMeDevice {
		t.Errorf("slots %+v (approved %s), vm address %s", wf.Slots, slots[0].Spec, vm.PrivateIP)
	}
	var perf struct {
		Accel string `json:"accel"`
	}
	if json.Unmarshal(vm.Performance, &perf) != nil || perf.Accel != "tcg" {
		t.Errorf("performance %s", vm.Performance)
	}
	// User-mode networking: the guest has QEMU's address; the slot's
	// MAC → IP reservation is written for the slice network all the same.
	if vm.PrivateIP == "" {
		t.Errorf("no VM address recorded")
	}
	if r := n.files("slices/dhcp-hosts.d"); len(r) != 1 {
		t.Errorf("DHCP reservations %v, want the slot's", r)
	} else if b, _ := os.ReadFile(filepath.Join(n.rtDir, "slices", "dhcp-hosts.d", r[0])); !bytes.Contains(b, []byte(spec.PrivateIP)) ||
		!bytes.Contains(b, []byte(wf.Slots[0].MACAddress)) {
		t.Errorf("DHCP reservation %s: %s, want %s → %s", r[0], b, wf.Slots[0].MACAddress, spec.PrivateIP)
	}
	if r := n.files("slices/terminal"); !slices.Contains(r, wf.VMName+".json") {
		t.Errorf("terminal records %v, want %s.json", r, wf.VMName)
	}

	// The allocation's terminal: gateway → node → SSH into the guest.
	tok := e.mintToken(a.ID, api.TerminalTokenRequest{Cols: 90, Rows: 25})
	br := e.dialTerminal(tok, wsOpts{})
	br.waitReady(90 * time.Second)
	// As the allocation's user, whose authorized_keys holds the
	// allocation's block that provision_user wrote in the guest.
	br.send(terminal.ChanStdin, []byte(fmt.Sprintf("echo vm-$((40+2)); id -un; grep -c '^# drover allocation %s begin$' ~/.ssh/authorized_keys\n", a.ID)))
	br.readUntil(fmt.Sprintf("vm-42\r\n%s\r\n1\r\n", user), 30*time.Second)
	br.send(terminal.ChanStdin, []byte("exit 3\n"))
	if c := br.control(30 * time.Second); c.Type != terminal.TypeExit || c.ExitCode != 3 {
		t.Fatalf("got %+v, want exit 3", c)
	}
	if s := e.waitSessionClosed(tok.SessionID, 10*time.Second); s.Mode != task.TerminalModeVMSSH {
		t.Errorf("session mode %s", s.Mode)
	}

	// Release: slice.vm_release with wipe, then the leases.
	var rel api.Allocation
	if st := e.op(http.MethodDelete, "/api/v1/allocations/"+a.ID, nil, &rel); st != http.StatusAccepted {
		t.Fatalf("release: HTTP %d", st)
	}
	rel = e.followSlice(a.ID, 3*time.Minute, nil, settled)
	if rel.State != api.AllocationReleased || rel.Workflow == nil || rel.Workflow.ReleaseTaskID == "" {
		t.Fatalf("after release: %+v", rel)
	}
	rt := e.waitTask(rel.Workflow.ReleaseTaskID, 10*time.Second)
	var relParams struct {
		Wipe bool `json:"wipe"`
	}
	if rt.State != api.TaskSucceeded || json.Unmarshal(rt.Params, &relParams) != nil || !relParams.Wipe {
		t.Errorf("vm_release %s params %s: %+v", rt.State, rt.Params, rt.Result.Error)
	}
	nv, err := os.ReadFile(n.nvme)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexFunc(nv, func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("the NVMe namespace is not wiped: byte %d is %#x", i, nv[i])
	}
	n.noSliceLeftovers(e)
}

// failedSlice checks a slice allocation that failed: at step with sig,
// the reason naming both and the correlation id, and nothing left.
func failedSlice(t *testing.T, e *env, n *sliceNode, a api.Allocation, step string, sig signal.Name) {
	t.Helper()
	wf := a.Workflow
	if a.State != api.AllocationFailed || wf == nil || wf.Status != "failed" {
		raw, _ := json.MarshalIndent(a, "", "  ")
		t.Fatalf("allocation not failed:\n%s", raw)
	}
	if wf.FailedStep != step || wf.Signal != string(sig) || wf.CorrelationID == "" {
		t.Errorf("failed at %s with %s (correlation id %q), want %s with %s", wf.FailedStep, wf.Signal, wf.CorrelationID, step, sig)
	}
	for _, want := range []string{step, string(sig), wf.CorrelationID} {
		if !strings.Contains(a.StateReason, want) {
			t.Errorf("state reason %q lacks %q", a.StateReason, want)
		}
	}
	n.noSliceLeftovers(e)
}
