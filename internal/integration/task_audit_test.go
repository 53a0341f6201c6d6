package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// auditProbe checks, as each task enqueue or cancel returns, that its
// audit record is already stored: a claim, or a reader, that sees the
// change must find its record (ADR 0016).
type auditProbe struct {
	store.Store
	mu      sync.Mutex
	missed  []string
	checked int
}

// check notes a miss unless target has a record of action.
func (p *auditProbe) check(ctx context.Context, target, action string) {
	evs, err := p.Store.ListAudit(ctx, store.AuditFilter{Target: target, Action: action})
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checked++
	if err != nil || len(evs) == 0 {
		p.missed = append(p.missed, fmt.Sprintf("%s of %s stored without its record (%v)", action, target, err))
	}
}

func (p *auditProbe) EnqueueTask(ctx context.Context, t store.Task, audit ...store.AuditEvent) error {
	if err := p.Store.EnqueueTask(ctx, t, audit...); err != nil {
		return err
	}
	p.check(ctx, t.ID, "task.enqueue")
	return nil
}

func (p *auditProbe) InsertTasks(ctx context.Context, ts []store.Task, audit ...store.AuditEvent) error {
	if err := p.Store.InsertTasks(ctx, ts, audit...); err != nil {
		return err
	}
	p.check(ctx, ts[0].ID, "task.enqueue_batch")
	return nil
}

func (p *auditProbe) CancelTask(ctx context.Context, id string, at time.Time, audit func(store.Task) []store.AuditEvent) (store.Task, error) {
	t, err := p.Store.CancelTask(ctx, id, at, audit)
	if err == nil {
		p.check(ctx, id, "task.cancel")
	}
	return t, err
}

func (p *auditProbe) ClaimTasks(ctx context.Context, nodeID string, now time.Time, leases store.ClaimLeases, max int,
	audit func([]store.Task) []store.AuditEvent) ([]store.Task, error) {
	ts, err := p.Store.ClaimTasks(ctx, nodeID, now, leases, max, audit)
	if err == nil {
		for _, t := range ts {
			p.check(ctx, t.ID, "task.claim")
		}
	}
	return ts, err
}

func (p *auditProbe) CompleteTask(ctx context.Context, nodeID, taskID string, state api.TaskState, result json.RawMessage,
	resultHash string, at time.Time, audit func(store.Task) []store.AuditEvent) (store.Task, error) {
	t, err := p.Store.CompleteTask(ctx, nodeID, taskID, state, result, resultHash, at, audit)
	if err == nil {
		p.check(ctx, taskID, "task.result")
	}
	return t, err
}

func (p *auditProbe) CreateOperatorToken(ctx context.Context, t store.OperatorToken, audit ...store.AuditEvent) error {
	if err := p.Store.CreateOperatorToken(ctx, t, audit...); err != nil {
		return err
	}
	p.check(ctx, t.ID, "token.create")
	return nil
}

func (p *auditProbe) RevokeOperatorToken(ctx context.Context, id string, audit ...store.AuditEvent) error {
	if err := p.Store.RevokeOperatorToken(ctx, id, audit...); err != nil {
		return err
	}
	p.check(ctx, id, "token.revoke")
	return nil
}

func (p *auditProbe) PutWorkloadSecret(ctx context.Context, ws store.WorkloadSecret,
	audit func(store.WorkloadSecret) []store.AuditEvent) (store.WorkloadSecret, error) {
	out, err := p.Store.PutWorkloadSecret(ctx, ws, audit)
	if err == nil {
		p.check(ctx, ws.Name, "secret.set")
	}
	return out, err
}

func (p *auditProbe) DeleteWorkloadSecret(ctx context.Context, name string, audit ...store.AuditEvent) error {
	if err := p.Store.DeleteWorkloadSecret(ctx, name, audit...); err != nil {
		return err
	}
	p.check(ctx, name, "secret.delete")
	return nil
}

func (p *auditProbe) RotateSigningKey(ctx context.Context, k store.SigningKey, audit ...store.AuditEvent) error {
	if err := p.Store.RotateSigningKey(ctx, k, audit...); err != nil {
		return err
	}
	if len(audit) == 0 {
		p.mu.Lock()
		p.missed = append(p.missed, "signing key "+k.KID+" rotated in without a record")
		p.mu.Unlock()
	}
	for _, a := range audit {
		p.check(ctx, k.KID, a.Action)
	}
	return nil
}

func (p *auditProbe) ApproveSlots(ctx context.Context, slots []store.Slot, audit ...store.AuditEvent) error {
	if err := p.Store.ApproveSlots(ctx, slots, audit...); err != nil {
		return err
	}
	for _, sl := range slots {
		p.check(ctx, sl.HostID+"/"+sl.SlotID, "slot.approve")
	}
	return nil
}

func (p *auditProbe) DeleteSlot(ctx context.Context, hostID, slotID string, audit ...store.AuditEvent) error {
	if err := p.Store.DeleteSlot(ctx, hostID, slotID, audit...); err != nil {
		return err
	}
	p.check(ctx, hostID+"/"+slotID, "slot.delete")
	return nil
}

// checkAll checks each of records, as the write that returned them has.
func (p *auditProbe) checkAll(ctx context.Context, records []store.AuditEvent) {
	for _, r := range records {
		p.check(ctx, r.Target, r.Action)
	}
}

func (p *auditProbe) CreateHost(ctx context.Context, h store.Host, audit ...store.AuditEvent) error {
	if err := p.Store.CreateHost(ctx, h, audit...); err != nil {
		return err
	}
	p.check(ctx, h.ID, "host.create")
	p.checkAll(ctx, audit)
	return nil
}

// UpdateHost writes no records, so it must not issue a bootstrap token.
func (p *auditProbe) UpdateHost(ctx context.Context, id string, fn func(*store.Host) error) (store.Host, error) {
	issued := false
	h, err := p.Store.UpdateHost(ctx, id, func(h *store.Host) error {
		was := h.TokenHash
		err := fn(h)
		issued = h.TokenHash != "" && h.TokenHash != was
		return err
	})
	if err == nil && issued {
		p.mu.Lock()
		p.missed = append(p.missed, "a bootstrap token of "+id+" stored without a record")
		p.mu.Unlock()
	}
	return h, err
}

func (p *auditProbe) UpdateHostAudited(ctx context.Context, id string, fn func(*store.Host) error,
	audit func(before, after store.Host) []store.AuditEvent) (store.Host, error) {
	if audit == nil {
		return p.Store.UpdateHostAudited(ctx, id, fn, nil)
	}
	var records []store.AuditEvent
	h, err := p.Store.UpdateHostAudited(ctx, id, fn, func(before, after store.Host) []store.AuditEvent {
		records = audit(before, after)
		return records
	})
	if err == nil {
		p.checkAll(ctx, records)
	}
	return h, err
}

func (p *auditProbe) CreateAllocation(ctx context.Context, a store.Allocation, audit ...store.AuditEvent) error {
	if err := p.Store.CreateAllocation(ctx, a, audit...); err != nil {
		return err
	}
	p.check(ctx, a.ID, "allocation.create")
	return nil
}

// UpdateAllocation writes no records, so it must not change an
// allocation's state.
func (p *auditProbe) UpdateAllocation(ctx context.Context, id string, fn func(*store.Allocation) error) (store.Allocation, error) {
	var was api.AllocationState
	a, err := p.Store.UpdateAllocation(ctx, id, func(a *store.Allocation) error {
		was = a.State
		return fn(a)
	})
	if err == nil && a.State != was {
		p.mu.Lock()
		p.missed = append(p.missed, fmt.Sprintf("allocation %s went from %s to %s without a record", id, was, a.State))
		p.mu.Unlock()
	}
	return a, err
}

func (p *auditProbe) UpdateAllocationAudited(ctx context.Context, id string, fn func(*store.Allocation) error,
	audit func(store.Allocation) []store.AuditEvent) (store.Allocation, error) {
	if audit == nil {
		return p.Store.UpdateAllocationAudited(ctx, id, fn, nil)
	}
	var records []store.AuditEvent
	a, err := p.Store.UpdateAllocationAudited(ctx, id, fn, func(a store.Allocation) []store.AuditEvent {
		records = audit(a)
		return records
	})
	if err == nil {
		p.checkAll(ctx, records)
	}
	return a, err
}

func (p *auditProbe) CreateTerminalSession(ctx context.Context, ts store.TerminalSession, audit ...store.AuditEvent) error {
	if err := p.Store.CreateTerminalSession(ctx, ts, audit...); err != nil {
		return err
	}
	p.check(ctx, ts.ID, "terminal.token_mint")
	return nil
}

// verify fails t for every change the probe saw stored without its
// record, and unless it checked at least want changes.
func (p *auditProbe) verify(t *testing.T, want int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.missed {
		t.Error(m)
	}
	if len(p.missed) == 0 && p.checked < want {
		t.Errorf("the probe checked %d changes, want %d", p.checked, want)
	}
}

// TestTokenAndSecretChangesStoredWithAudit: an operator token's creation
// and revocation, a workload secret's set and delete, and a signing-key
// rotation store their audit record with the change.
func TestTokenAndSecretChangesStoredWithAudit(t *testing.T) {
	p := &auditProbe{Store: openSQLite(t)}
	e := startEnv(t, p)
	var tok api.OperatorToken
	if st := e.op(http.MethodPost, "/api/v1/tokens", api.CreateOperatorTokenRequest{Name: "ci", Role: api.RoleViewer}, &tok); st != http.StatusCreated {
		t.Fatalf("create token: HTTP %d", st)
	}
	if st := e.op(http.MethodPost, "/api/v1/tokens/"+tok.ID+"/revoke", nil, nil); st != http.StatusNoContent {
		t.Fatalf("revoke token: HTTP %d", st)
	}
	for _, v := range []string{"one", "two"} {
		if st := e.op(http.MethodPut, "/api/v1/secrets/db-password", map[string]string{"value": v}, nil); st != http.StatusCreated &&
			st != http.StatusOK {
			t.Fatalf("set secret: HTTP %d", st)
		}
	}
	if st := e.op(http.MethodDelete, "/api/v1/secrets/db-password", nil, nil); st != http.StatusNoContent {
		t.Fatalf("delete secret: HTTP %d", st)
	}
	if st := e.op(http.MethodPost, "/api/v1/signing-keys/rotate", nil, nil); st != http.StatusOK {
		t.Fatalf("rotate the signing key: HTTP %d", st)
	}
	p.verify(t, 7) // and the first key's creation at start
}

// TestHostAllocationAndTerminalChangesStoredWithAudit: a host's creation
// with its bootstrap token, the token's rotation, an allocation's
// creation, its settling on its task's result and its release, and a
// terminal token's mint store their audit records with the change
// (ADR 0016): each is a credential or an access grant.
func TestHostAllocationAndTerminalChangesStoredWithAudit(t *testing.T) {
	p := &auditProbe{Store: openSQLite(t)}
	e := startEnv(t, p)
	n := startAPINode(e, "node-a") // host.create, token.bootstrap_issue, then the enrolment's records
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-a/rotate-token", nil, nil); st != http.StatusOK {
		t.Fatalf("rotate the bootstrap token: HTTP %d", st)
	}
	var a api.Allocation
	if st := e.op(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{HostID: "node-a", Username: "alice"}, &a); st != http.StatusCreated {
		t.Fatalf("create allocation: HTTP %d", st)
	}
	if st, _, body := e.nodeCall(n.id.client, http.MethodGet, nodePath("node-a", "/tasks/wait?timeout=5s"), nil); st != http.StatusOK {
		t.Fatalf("claim the provision task: %d %s", st, body)
	}
	res := api.TaskResult{Status: api.ResultSucceeded, Output: json.RawMessage(`{}`), FinishedAt: time.Now().UTC()}
	if st, _, body := e.nodeCall(n.id.client, http.MethodPost, nodePath("node-a", "/tasks/"+a.ProvisionTaskID+"/result"), res); st != http.StatusOK {
		t.Fatalf("result: %d %s", st, body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.State != api.AllocationActive && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		e.op(http.MethodGet, "/api/v1/allocations/"+a.ID, nil, &a)
	}
	if a.State != api.AllocationActive {
		t.Fatalf("allocation %s is %s after its provision task succeeded, want active", a.ID, a.State)
	}
	var tok api.TerminalToken
	if st := e.op(http.MethodPost, "/api/v1/allocations/"+a.ID+"/terminal-token", nil, &tok); st != http.StatusCreated {
		t.Fatalf("mint a terminal token: HTTP %d", st)
	}
	if st := e.op(http.MethodDelete, "/api/v1/allocations/"+a.ID, nil, nil); st != http.StatusAccepted {
		t.Fatalf("release: HTTP %d", st)
	}
	for _, want := range []struct{ action, target string }{
		{"host.create", "node-a"}, {"token.bootstrap_issue", "node-a"}, {"token.bootstrap_rotate", "node-a"},
		{"allocation.create", a.ID}, {"allocation.state", a.ID}, {"terminal.token_mint", tok.SessionID},
		{"allocation.release", a.ID},
	} {
		if !e.auditHas(want.action, want.target, "") {
			t.Errorf("no %s record of %s", want.action, want.target)
		}
	}
	p.verify(t, 7)
}

// TestTaskChangesStoredWithAudit: an operator's enqueue, batch enqueue and
// cancel, and a node's claim and result, store their audit record with the
// change, so the node's claim of a task it was parked waiting for is
// recorded after the enqueue.
func TestTaskChangesStoredWithAudit(t *testing.T) {
	p := &auditProbe{Store: openSQLite(t)}
	e := startEnv(t, p)
	n := startAPINode(e, "node-a")

	claimed := make(chan string, 1)
	go func() {
		st, _, body := e.nodeCall(n.id.client, http.MethodGet, nodePath("node-a", "/tasks/wait?timeout=10s"), nil)
		claimed <- fmt.Sprintf("%d %s", st, body)
	}()
	e.waitMetric(`drover_node_long_polls{route="tasks"}`, 1, 5*time.Second)
	task := e.enqueue("node-a", "diag.echo", map[string]any{"message": "parked"})
	select {
	case got := <-claimed:
		if got[:3] != "200" {
			t.Fatalf("wait: %s", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the parked wait claimed nothing")
	}
	evs, err := p.Store.ListAudit(t.Context(), store.AuditFilter{Target: task.ID})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, ev := range slices.Backward(evs) {
		actions = append(actions, ev.Action)
	}
	if want := []string{"task.enqueue", "task.claim"}; !slices.Equal(actions, want) {
		t.Errorf("records of %s: %v, want %v", task.ID, actions, want)
	}
	res := api.TaskResult{Status: api.ResultSucceeded, Output: json.RawMessage(`{"message":"parked"}`),
		CorrelationID: task.CorrelationID, FinishedAt: time.Now().UTC()}
	if st, _, body := e.nodeCall(n.id.client, http.MethodPost, nodePath("node-a", "/tasks/"+task.ID+"/result"), res); st != http.StatusOK {
		t.Fatalf("result: %d %s", st, body)
	}

	echo := api.EnqueueTaskRequest{NodeID: "node-a", Type: "diag.echo", Params: []byte(`{"message":"batch"}`)}
	var batch api.EnqueueTaskBatchResponse
	if st := e.op(http.MethodPost, "/api/v1/tasks:batch", api.EnqueueTaskBatchRequest{Items: []api.EnqueueTaskRequest{echo, echo}},
		&batch); st != http.StatusCreated {
		t.Fatalf("batch: HTTP %d", st)
	}
	if st := e.op(http.MethodPost, "/api/v1/tasks/"+batch.Tasks[1].ID+"/cancel", nil, nil); st != http.StatusOK {
		t.Fatalf("cancel: HTTP %d", st)
	}
	p.verify(t, 6) // the parked task's enqueue, claim and result, the batch and the cancel
}
