package sliceflow

import (
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// atProvisionUser creates alc_u on one slot and answers its provision:
// the workflow awaits its allocation.provision_user.
func atProvisionUser(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, 0)
	if err := h.create("alc_u", 1); err != nil {
		t.Fatal(err)
	}
	h.answer(h.queued(task.TypeVMProvision)[0].ID, true, readyOutput(), true)
	if w := h.wantStatus("alc_u", store.SliceFlowProvisioning, api.AllocationProvisioning); w.Step != StepProvisionUser {
		t.Fatalf("at %s", w.Step)
	}
	return h
}

// TestProvisionUserCompensation: a provision_user that fails (the node
// answers failed, the task expires, or it never answers) fails the
// workflow at provision_user; the compensation removes the user in the
// guest (allocation.deprovision_user with vm_name), then releases the VM
// and the slot, whatever the deprovision's own outcome.
func TestProvisionUserCompensation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		finish   func(h *harness, user store.Task)
		sig      signal.Name
		deprovOK bool
	}{
		{"failed", func(h *harness, u store.Task) { h.answer(u.ID, false, map[string]any{}, true) }, signal.SliceGuestUserFailed, true},
		{"failed, deprovision fails too", func(h *harness, u store.Task) { h.answer(u.ID, false, map[string]any{}, true) },
			signal.SliceGuestUserFailed, false},
		{"expired", func(h *harness, _ store.Task) {
			_, expired, err := h.st.ReapTasks(h.ctx, h.clk.now().Add(taskTTL+time.Hour), nil)
			if err != nil || len(expired) != 1 {
				h.t.Fatalf("reap: %v %v", expired, err)
			}
			h.bus.PublishFinished(h.ctx, taskbus.Finished{Task: expired[0]})
		}, signal.SliceGuestUserFailed, true},
		{"never answered", func(h *harness, _ store.Task) {
			h.clk.skip(StuckAfter + time.Minute)
			h.restart()
			if err := h.room.Sweep(h.ctx); err != nil {
				h.t.Fatal(err)
			}
		}, signal.SliceWorkflowStuck, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := atProvisionUser(t)
			users := h.queued(task.TypeAllocProvisionUser)
			if len(users) != 1 {
				t.Fatalf("%d provision_user tasks", len(users))
			}
			tc.finish(h, users[0])
			h.wantStatus("alc_u", store.SliceFlowCompensating, api.AllocationProvisioning)
			if n := len(h.all(task.TypeVMRelease)); n != 0 {
				t.Fatalf("release queued before the user was removed (%d)", n)
			}
			de := h.queued(task.TypeAllocDeprovisionUser)
			if len(de) != 1 {
				t.Fatalf("%d deprovision_user tasks", len(de))
			}
			dp, fe := task.DecodeAllocDeprovisionUserParams(de[0].Params)
			up, _ := task.DecodeAllocProvisionUserParams(users[0].Params)
			if fe != nil || dp.VMName == "" || dp.VMName != up.VMName || dp.Username != "alice" || dp.AllocationID != "alc_u" {
				t.Fatalf("deprovision params %+v %v", dp, fe)
			}
			h.answer(de[0].ID, tc.deprovOK, map[string]any{}, true)
			rel := h.queued(task.TypeVMRelease)
			if len(rel) != 1 {
				t.Fatalf("%d release tasks", len(rel))
			}
			h.answer(rel[0].ID, true, map[string]any{}, true)
			h.failedWith("alc_u", StepProvisionUser, tc.sig)
			states := h.stepStates("alc_u")
			for _, s := range []string{StepDeprovisionUser, StepReleaseVM, StepAwaitRelease, StepFreeLeases} {
				if states[compensatePrefix+s] != store.SliceStepDone {
					t.Errorf("compensate_%s: %q", s, states[compensatePrefix+s])
				}
			}
		})
	}
}

// TestProvisionUserResume: a control plane that stops after recording the
// provision_user task's id but before queueing it queues that same task
// when resumed (one task, one id); a result that arrives while it is down
// is read on resume.
func TestProvisionUserResume(t *testing.T) {
	h := newHarness(t, 0)
	h.room.hook = func(p string) error {
		if p == "begin:"+StepProvisionUser {
			h.tasks.mu.Lock()
			h.tasks.failEnqueue = true
			h.tasks.mu.Unlock()
		}
		return nil
	}
	if err := h.create("alc_u", 1); err != nil {
		t.Fatal(err)
	}
	h.answer(h.queued(task.TypeVMProvision)[0].ID, true, readyOutput(), true)
	if n := len(h.all(task.TypeAllocProvisionUser)); n != 0 {
		t.Fatalf("%d provision_user tasks with the queue down", n)
	}
	var recorded string
	steps, _ := h.st.ListSliceSteps(h.ctx, "alc_u")
	for _, s := range steps {
		if s.Step == StepProvisionUser {
			recorded = s.TaskID
		}
	}
	if recorded == "" {
		t.Fatal("provision_user recorded no task id before queueing")
	}
	h.tasks.failEnqueue = false
	for range 2 { // resumed twice: still one task
		h.restart()
		if err := h.room.Resume(h.ctx); err != nil {
			t.Fatal(err)
		}
	}
	u := h.answerUser(true, false)
	if u.ID != recorded || len(h.all(task.TypeAllocProvisionUser)) != 1 {
		t.Fatalf("queued %s, recorded %s; %d tasks", u.ID, recorded, len(h.all(task.TypeAllocProvisionUser)))
	}
	h.restart()
	if err := h.room.Resume(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.wantStatus("alc_u", store.SliceFlowActive, api.AllocationActive)
	if st := h.stepStates("alc_u"); st[compensatePrefix+StepDeprovisionUser] != "" {
		t.Fatalf("steps %v", st)
	}
}

// TestReleaseWhileProvisioningUser: a release asked while provision_user
// awaits its task waits for it, then releases the VM (which removes the
// user with the guest: no deprovision task).
func TestReleaseWhileProvisioningUser(t *testing.T) {
	h := atProvisionUser(t)
	if _, err := h.room.Release(h.ctx, "alc_u"); err != nil {
		t.Fatal(err)
	}
	h.wantStatus("alc_u", store.SliceFlowProvisioning, api.AllocationProvisioning)
	if n := len(h.all(task.TypeVMRelease)); n != 0 {
		t.Fatalf("released under a running provision_user (%d)", n)
	}
	h.answerUser(true, true)
	h.wantStatus("alc_u", store.SliceFlowReleasing, api.AllocationReleasing)
	h.answer(h.queued(task.TypeVMRelease)[0].ID, true, map[string]any{}, true)
	h.wantStatus("alc_u", store.SliceFlowReleased, api.AllocationReleased)
	if n := len(h.all(task.TypeAllocDeprovisionUser)); n != 0 || len(h.leases()) != 0 {
		t.Fatalf("%d deprovision tasks, leases %v", n, h.leases())
	}
}

// A user task that is not the workflow's (a host allocation's, an
// operator's) does not move it.
func TestForeignUserTaskIgnored(t *testing.T) {
	h := atProvisionUser(t)
	other := h.tasks.NewTask(h.ctx, "h1", task.TypeAllocProvisionUser,
		[]byte(`{"allocation_id":"alc_u","username":"bob"}`), time.Hour)
	if err := h.st.EnqueueTask(h.ctx, other); err != nil {
		t.Fatal(err)
	}
	h.answer(other.ID, false, map[string]any{}, true)
	w := h.wantStatus("alc_u", store.SliceFlowProvisioning, api.AllocationProvisioning)
	if w.Step != StepProvisionUser || !strings.Contains(h.stepStates("alc_u")[StepProvisionUser], "started") {
		t.Fatalf("at %s, steps %v", w.Step, h.stepStates("alc_u"))
	}
}

// A slice allocation's shell and sudo go to provision_user; the shell is
// checked as allocation.provision_user checks it.
func TestValidateShellSudo(t *testing.T) {
	base := api.CreateAllocationRequest{Username: "alice", SliceRequest: api.SliceRequest{Slots: 1,
		Image: "https://images.example/jammy.qcow2", ImageSHA256: strings.Repeat("ab", 32)}}
	ok := base
	ok.Shell, ok.Sudo = "/bin/bash", true
	if fe := Validate(ok); len(fe) != 0 {
		t.Fatalf("shell and sudo refused: %+v", fe)
	}
	bad := base
	bad.Shell = "bash"
	if fe := Validate(bad); len(fe) != 1 || fe[0].Field != "shell" {
		t.Fatalf("relative shell: %+v", fe)
	}
	p := userParams(store.SliceWorkflow{AllocationID: "alc_v"}, ok, plan{VMName: "slice-alc_v"})
	if p.Shell != "/bin/bash" || !p.Sudo || p.VMName != "slice-alc_v" || p.Username != "alice" {
		t.Fatalf("params %+v", p)
	}
}
