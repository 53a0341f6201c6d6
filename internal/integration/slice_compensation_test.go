package integration

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/sliceflow"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// booted is done for followSlice: slice.vm_provision has started the VM
// (its virt_install phase is reported) and awaits its readiness.
func booted(a api.Allocation) bool {
	if a.Workflow == nil || a.State != api.AllocationProvisioning {
		return settled(a)
	}
	return slices.ContainsFunc(a.Workflow.Phases, func(p api.SlicePhase) bool { return p.Phase == slicevm.PhaseVirtInstall })
}

// TestSliceWorkflowReadinessFailsAcrossRestartTCG: a guest that never
// prints the readiness marker the allocation asks for, and the control
// plane stopped while the workflow awaits slice.vm_provision and started
// again (a new control plane on the same store, at the same addresses: on
// PostgreSQL, as another replica taking over). The new control plane
// resumes the workflow at its recorded step (no
// step or task repeated), the provision fails at readiness on the node,
// and the compensation releases the VM and the slot: the allocation is
// failed with the step, the signal and the correlation id, and nothing
// is left.
func TestSliceWorkflowReadinessFailsAcrossRestartTCG(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { readinessFailsAcrossRestart(t, b.open(t)) })
	}
}

func readinessFailsAcrossRestart(t *testing.T, st store.Store) {
	e := startEnv(t, st)
	n := newSliceNode(t, e, "slice-nr")
	n.approveSlots(e)
	req := n.request("bob")
	req.ReadinessMarker, req.ReadinessTimeoutSeconds = "DROVER-NEVER-READY", 30
	a := e.createSlice(req)
	a = e.followSlice(a.ID, 4*time.Minute, nil, booted)
	if a.State != api.AllocationProvisioning || a.Workflow.Step != sliceflow.StepAwaitProvision {
		t.Fatalf("not awaiting the provision: %s, step %s", a.State, a.Workflow.Step)
	}

	opAddr, nodeAddr := strings.TrimPrefix(e.opURL, "http://"), strings.TrimPrefix(e.nodeURL, "https://")
	e.stop()
	e.stop = nil
	e2 := startEnvAt(t, st, opAddr, nodeAddr)
	a = e2.followSlice(a.ID, 5*time.Minute, nil, settled)
	failedSlice(t, e2, n, a, sliceflow.StepAwaitProvision, signal.SliceProvisionFailed)
	if !strings.Contains(a.Workflow.Error, slicevm.PhaseReadiness) {
		t.Errorf("error %q does not name the readiness phase", a.Workflow.Error)
	}
	var steps []string
	for _, s := range a.Workflow.Steps {
		steps = append(steps, s.Step)
		// No provision_user was queued: no user to remove in the guest.
		if s.Step == "compensate_"+sliceflow.StepDeprovisionUser && (s.State != "skipped" || s.TaskID != "") {
			t.Errorf("step %+v, want skipped without a task", s)
		}
	}
	if want := []string{sliceflow.StepLeaseSlots, sliceflow.StepVMProvision, sliceflow.StepAwaitProvision,
		"compensate_" + sliceflow.StepDeprovisionUser, "compensate_" + sliceflow.StepReleaseVM, "compensate_" + sliceflow.StepAwaitRelease,
		"compensate_" + sliceflow.StepFreeLeases}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	var provs []api.Task
	if code := e2.op(http.MethodGet, "/api/v1/tasks?type="+task.TypeVMProvision, nil, &provs); code != http.StatusOK || len(provs) != 1 {
		t.Errorf("slice.vm_provision tasks: HTTP %d, %d of them, want 1", code, len(provs))
	}
}

// TestSliceWorkflowAgentStoppedTCG stops the agent while slice.vm_provision
// waits for the guest and starts it again on the same state: the workflow
// resolves without the operator (the provision finishes, or fails and is
// compensated) and nothing is leaked.
func TestSliceWorkflowAgentStoppedTCG(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	n := newSliceNode(t, e, "slice-ks")
	n.approveSlots(e)
	a := e.createSlice(n.request("carol"))
	a = e.followSlice(a.ID, 4*time.Minute, nil, booted)
	if a.State != api.AllocationProvisioning {
		t.Fatalf("settled before the agent was stopped: %s %s", a.State, a.StateReason)
	}
	n.stop()
	n.start(e)
	a = e.followSlice(a.ID, 5*time.Minute, nil, settled)
	switch a.State {
	case api.AllocationFailed:
		t.Logf("compensated: %s", a.StateReason)
		failedSlice(t, e, n, a, sliceflow.StepAwaitProvision, signal.SliceProvisionFailed)
	case api.AllocationActive:
		t.Logf("finished after the restart")
		if code := e.op(http.MethodDelete, "/api/v1/allocations/"+a.ID, nil, nil); code != http.StatusAccepted {
			t.Fatalf("release: HTTP %d", code)
		}
		if a = e.followSlice(a.ID, 3*time.Minute, nil, settled); a.State != api.AllocationReleased {
			t.Fatalf("release: %s %s", a.State, a.StateReason)
		}
		n.noSliceLeftovers(e)
	default:
		t.Fatalf("allocation %s: %s", a.State, a.StateReason)
	}
}
