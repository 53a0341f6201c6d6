package sliceflow

// The guest user steps: provision_user queues allocation.provision_user
// with the VM's name (the node creates the allocation's user inside the
// guest over its brokered SSH channel) and awaits it by task event; a
// failing workflow whose provision_user task was queued first runs
// compensate_deprovision_user (allocation.deprovision_user in the guest),
// then releases the VM.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// userParams are allocation.provision_user's params for the workflow's
// VM: the allocation's user (the VM's default user, made by cloud-init in
// slice.vm_provision), its keys, and the request's shell and sudo.
func userParams(w store.SliceWorkflow, req api.CreateAllocationRequest, p plan) task.AllocProvisionUserParams {
	return task.AllocProvisionUserParams{AllocationID: w.AllocationID, Username: req.Username,
		SSHAuthorizedKeys: req.SSHAuthorizedKeys, Shell: req.Shell, Sudo: req.Sudo, VMName: p.VMName}
}

// provisionUser queues allocation.provision_user with vm_name (once: the
// task's id is recorded before it is queued) and waits for its result by
// task event. A failed or expired task fails the step with
// slice_guest_user_failed (the node rolled its change back); one that
// never answers fails it with slice_workflow_stuck.
func (s *Room) provisionUser(ctx context.Context, w *store.SliceWorkflow, rec *store.SliceStep) (outcome, error) {
	req, err := specOf(*w)
	if err != nil {
		return outcome{}, err
	}
	p, err := planOf(*w)
	if err != nil {
		return outcome{}, err
	}
	params, _ := json.Marshal(userParams(*w, req, p))
	if _, fe := task.DecodeAllocProvisionUserParams(params); len(fe) > 0 {
		return outcome{kind: fail, signal: signal.SliceGuestUserFailed,
			detail: fmt.Sprintf("allocation.provision_user params refused: %s: %s", fe[0].Field, fe[0].Message)}, nil
	}
	id, err := s.enqueue(ctx, w, rec, task.TypeAllocProvisionUser, params)
	if err != nil {
		return outcome{}, err
	}
	t, res, err := s.finished(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return missing(task.TypeAllocProvisionUser, id), nil
	}
	if err != nil {
		return outcome{kind: wait}, err
	}
	if t == nil {
		if detail, late := s.overdue(rec, task.TypeAllocProvisionUser, id); late {
			return outcome{kind: fail, signal: signal.SliceWorkflowStuck, detail: detail}, nil
		}
		return outcome{kind: wait}, nil
	}
	if t.State != api.TaskSucceeded {
		return outcome{kind: fail, signal: signal.SliceGuestUserFailed, detail: taskFailure(*t, res)}, nil
	}
	return outcome{detail: fmt.Sprintf("%s succeeded: user %s in vm %s%s", id, req.Username, p.VMName, userSummary(res))}, nil
}

// userSummary is what the node reported of the guest user.
func userSummary(res *api.TaskResult) string {
	if res == nil {
		return ""
	}
	var out struct {
		User *struct {
			UID     int  `json:"uid"`
			Created bool `json:"created"`
			Keys    int  `json:"keys"`
			Sudo    bool `json:"sudo"`
		} `json:"user"`
	}
	if json.Unmarshal(res.Output, &out) != nil || out.User == nil {
		return ""
	}
	how := "existed"
	if out.User.Created {
		how = "created"
	}
	return fmt.Sprintf(" (uid %d, %s, %d keys, sudo %v)", out.User.UID, how, out.User.Keys, out.User.Sudo)
}

// deprovisionUser, compensating, removes what provision_user did in the
// guest when its task was queued: allocation.deprovision_user with
// vm_name (the node deletes the account only if that provision created
// it; a VM no longer there has nothing to remove), awaited by task event.
// Its failure is recorded and does not stop the compensation: the VM's
// release that follows removes the guest with the user.
func (s *Room) deprovisionUser(ctx context.Context, w *store.SliceWorkflow, rec *store.SliceStep) (outcome, error) {
	recs, err := s.steps(ctx, w.AllocationID)
	if err != nil {
		return outcome{}, err
	}
	if recs[StepProvisionUser].TaskID == "" {
		return outcome{kind: skipped, detail: "no allocation.provision_user was queued: no user to remove from the guest"}, nil
	}
	req, err := specOf(*w)
	if err != nil {
		return outcome{}, err
	}
	p, err := planOf(*w)
	if err != nil {
		return outcome{}, err
	}
	params, _ := json.Marshal(task.AllocDeprovisionUserParams{AllocationID: w.AllocationID, Username: req.Username,
		VMName: p.VMName}.WithDefaults())
	id, err := s.enqueue(ctx, w, rec, task.TypeAllocDeprovisionUser, params)
	if err != nil {
		return outcome{}, err
	}
	t, res, err := s.finished(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return outcome{detail: missing(task.TypeAllocDeprovisionUser, id).detail + "; the VM's release removes the user"}, nil
	}
	if err != nil {
		return outcome{kind: wait}, err
	}
	if t == nil {
		if detail, late := s.overdue(rec, task.TypeAllocDeprovisionUser, id); late {
			return outcome{detail: detail + "; the VM's release removes the user"}, nil
		}
		return outcome{kind: wait}, nil
	}
	if t.State != api.TaskSucceeded {
		return outcome{detail: "allocation.deprovision_user did not succeed (" + taskFailure(*t, res) + "); the VM's release removes the user"}, nil
	}
	return outcome{detail: id + " succeeded"}, nil
}

// ownsTask reports whether taskID is one of w's tasks: its provision or
// release, or a task a step recorded (the guest user's).
func (s *Room) ownsTask(ctx context.Context, w store.SliceWorkflow, taskID string) bool {
	if w.ProvisionTaskID == taskID || w.ReleaseTaskID == taskID {
		return true
	}
	recs, err := s.steps(ctx, w.AllocationID)
	if err != nil {
		return false
	}
	for _, r := range recs {
		if r.TaskID == taskID {
			return true
		}
	}
	return false
}

// userTaskSettled reports whether the provision_user task, if one was
// queued, has finished (a release asked meanwhile waits for it).
func (s *Room) userTaskSettled(ctx context.Context, w store.SliceWorkflow) (bool, error) {
	recs, err := s.steps(ctx, w.AllocationID)
	if err != nil {
		return false, err
	}
	id := recs[StepProvisionUser].TaskID
	if id == "" {
		return true, nil
	}
	t, err := s.store.GetTask(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return t.State.Terminal(), nil
}
