package termgw

// Terminals into slice VMs: the allocation's own workflow names the VM
// and its node; the node brokers SSH into it (terminal.open mode vm_ssh).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
)

// sliceVM returns the VM and node of slice allocation a: those its own
// provisioning workflow recorded, so a session can only ever name the VM
// provisioned for its allocation. It refuses (409) while the workflow has
// not made the VM active.
func (s *Gateway) sliceVM(ctx context.Context, a store.Allocation) (vm, nodeID string, err error) {
	w, err := s.store.GetSliceWorkflow(ctx, a.ID)
	if errors.Is(err, store.ErrNotFound) {
		return "", "", httpapi.Errorf(http.StatusConflict, "allocation_not_bound",
			"slice allocation %q has no provisioning workflow", a.ID)
	} else if err != nil {
		return "", "", err
	}
	var p struct {
		VMName string `json:"vm_name"`
	}
	if len(w.Plan) > 0 {
		if err := json.Unmarshal(w.Plan, &p); err != nil {
			return "", "", fmt.Errorf("slice workflow of %s: plan: %w", a.ID, err)
		}
	}
	switch {
	case w.Status != store.SliceFlowActive || p.VMName == "" || w.HostID == "":
		return "", "", httpapi.Errorf(http.StatusConflict, "allocation_not_bound",
			"slice allocation %q has no running VM yet (workflow %s, step %s)", a.ID, w.Status, w.Step)
	case a.HostID != "" && a.HostID != w.HostID:
		return "", "", httpapi.Errorf(http.StatusConflict, "allocation_not_bound",
			"slice allocation %q is on host %q but its VM on %q", a.ID, a.HostID, w.HostID)
	}
	return p.VMName, w.HostID, nil
}

// sessionVM is the VM of a vm_ssh session's allocation, looked up again
// when terminal.open is queued (the session does not store it).
func (s *Gateway) sessionVM(ctx context.Context, sess store.TerminalSession) (string, error) {
	a, err := s.store.GetAllocation(ctx, sess.AllocationID)
	if err != nil {
		return "", fmt.Errorf("allocation %q: %w", sess.AllocationID, err)
	}
	vm, nodeID, err := s.sliceVM(ctx, a)
	if err != nil {
		return "", err
	}
	if nodeID != sess.NodeID {
		return "", fmt.Errorf("the VM of allocation %q moved from node %q to %q", a.ID, sess.NodeID, nodeID)
	}
	return vm, nil
}
