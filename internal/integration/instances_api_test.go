package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// apiNode is a hand-enrolled node that keeps itself healthy with
// heartbeats reporting a fixed capacity, and speaks the instance routes over
// plain mTLS (no reconciler).
type apiNode struct {
	e  *env
	id nodeIdentity
}

// startAPINode creates and enrols hostID, then heartbeats until the test
// ends with a capacity of 4 vCPU and 4 GiB free beyond a 1 vCPU, 512 MiB
// reservation.
func startAPINode(e *env, hostID string) *apiNode {
	e.t.Helper()
	n := &apiNode{e: e, id: e.enroll(hostID, e.createHost(hostID).Token)}
	hb := api.Heartbeat{Capacity: &api.CapacityReport{
		Total:    api.Capacity{VCPUs: 5, MemoryMiB: 4608, DiskGiB: 100},
		Reserved: api.Capacity{VCPUs: 1, MemoryMiB: 512}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			e.nodeCall(n.id.client, http.MethodPost, nodePath(hostID, "/heartbeat"), hb)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	e.t.Cleanup(func() { cancel(); <-done })
	e.waitHostStatus(hostID, api.HostHealthy, 10*time.Second)
	return n
}

// set fetches the node's desired set, long-polling with etag and wait. An
// undecodable 200 is reported as status 0 (set may run in a goroutine).
func (n *apiNode) set(etag, wait string) (int, api.NodeInstances) {
	var set api.NodeInstances
	st, _, body := n.e.nodeCall(n.id.client, http.MethodGet, nodePath(n.id.id, "/instances?etag="+etag+"&wait="+wait), nil)
	if st == http.StatusOK {
		if err := json.Unmarshal(body, &set); err != nil {
			return 0, set
		}
	}
	return st, set
}

// report posts a status report through node's own path.
func (n *apiNode) report(iid string, rep api.InstanceStatusReport) (int, string) {
	st, code, _ := n.e.nodeCall(n.id.client, http.MethodPost, nodePath(n.id.id, "/instances/"+iid+"/status"), rep)
	return st, code
}

// polled is the answer of a background long-poll.
type polled struct {
	status int
	set    api.NodeInstances
}

// asyncSet runs set in the background.
func (n *apiNode) asyncSet(etag, wait string) <-chan polled {
	ch := make(chan polled, 1)
	go func() {
		st, set := n.set(etag, wait)
		ch <- polled{st, set}
	}()
	return ch
}

func waitSet(t *testing.T, ch <-chan polled, what string) api.NodeInstances {
	t.Helper()
	select {
	case p := <-ch:
		if p.status != http.StatusOK {
			t.Fatalf("long-poll woken by %s: HTTP %d", what, p.status)
		}
		return p.set
	case <-time.After(5 * time.Second):
		t.Fatalf("long-poll not woken by %s", what)
	}
	return api.NodeInstances{}
}

func apiSpec(vcpus, memMiB int) api.InstanceSpec {
	return api.InstanceSpec{Image: api.Artifact{URL: "https://images.example/base.qcow2", SHA256: strings.Repeat("cd", 32)},
		VCPUs: vcpus, MemoryMiB: memMiB}
}

// TestInstancesNodeAPI drives the declarative instance routes over HTTP with
// two hand-enrolled nodes: placement, node isolation, long-polls woken by
// create and drain, status reports, the delete flow, slots and scaling.
func TestInstancesNodeAPI(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			// 1:1 vCPUs, so the capacity checks below count whole CPUs.
			e := startEnv(t, b.open(t), func(c *server.Config) { c.VCPUAllocationRatio = 1 })
			a, nb := startAPINode(e, "node-a"), startAPINode(e, "node-b")
			op := func(method, path string, in, out any, want int) {
				t.Helper()
				if st := e.op(method, path, in, out); st != want {
					t.Fatalf("%s %s: HTTP %d, want %d", method, path, st, want)
				}
			}

			// A long-poll with the current etag sleeps until an instance is
			// created on the node.
			st, empty := a.set("", "")
			if st != http.StatusOK || len(empty.Instances) != 0 || empty.Draining || len(empty.ETag) != 64 {
				t.Fatalf("empty set: %d %+v", st, empty)
			}
			poll := a.asyncSet(empty.ETag, "10s")
			time.Sleep(200 * time.Millisecond)
			select {
			case p := <-poll:
				t.Fatalf("long-poll answered before any change: %+v", p)
			default:
			}
			var a1 api.Instance
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "a1", HostID: "node-a",
				Labels: map[string]string{"app": "x"}, Spec: apiSpec(2, 1024)}, &a1, http.StatusCreated)
			if !strings.HasPrefix(a1.ID, "i-") || len(a1.ID) != 14 || a1.Phase != api.InstancePending ||
				a1.DesiredState != api.DesiredRunning || a1.Generation != 1 || a1.CreatedBy != "operator:test" {
				t.Fatalf("created %+v", a1)
			}
			set := waitSet(t, poll, "a create")
			if len(set.Instances) != 1 || set.Instances[0].ID != a1.ID || set.Instances[0].Generation != 1 ||
				set.Instances[0].Spec.MemoryMiB != 1024 || set.ETag == empty.ETag {
				t.Fatalf("set after create: %+v", set)
			}
			if !e.auditHas("instance.create", a1.ID, "ok") {
				t.Error("create not audited")
			}

			// Node B sees nothing of A's and can neither read A's set nor
			// report on A's instance.
			if _, bset := nb.set("", ""); len(bset.Instances) != 0 {
				t.Errorf("node B's set holds %+v", bset.Instances)
			}
			if st, code, _ := e.nodeCall(nb.id.client, http.MethodGet, nodePath("node-a", "/instances"), nil); st != http.StatusForbidden || code != "node_mismatch" {
				t.Errorf("B reading A's set: %d %s, want 403 node_mismatch", st, code)
			}
			if st, code := nb.report(a1.ID, api.InstanceStatusReport{Generation: 1, Phase: api.InstanceReady}); st != http.StatusNotFound || code != "instance_not_found" {
				t.Errorf("B reporting A's instance: %d %s, want 404 instance_not_found", st, code)
			}
			if !e.auditHas("instance.status", a1.ID, "denied") {
				t.Error("B's refused report not audited")
			}

			// Status reports: validated, recorded, identical ones are no-ops,
			// stale ones ignored.
			now := time.Now().UTC().Truncate(time.Millisecond)
			for _, bad := range []api.InstanceStatusReport{{Generation: 1, Phase: "Running"},
				{Generation: 1, Phase: api.InstanceFailed, ReasonCode: "gremlins"}, {Generation: 2, Phase: api.InstanceReady}} {
				if st, code := a.report(a1.ID, bad); st != http.StatusUnprocessableEntity || code != "invalid_payload" {
					t.Errorf("report %+v: %d %s, want 422", bad, st, code)
				}
			}
			ready := api.InstanceStatusReport{Generation: 1, Phase: api.InstanceReady, At: now,
				Runtime: &api.InstanceRuntime{Runtime: "qemu", PID: 42, Ports: map[string]int{"ssh": 2222}}}
			if st, _ := a.report(a1.ID, ready); st != http.StatusOK {
				t.Fatalf("ready report: %d", st)
			}
			var got api.Instance
			op(http.MethodGet, "/api/v1/instances/a1", nil, &got, http.StatusOK) // by name
			if got.ID != a1.ID || got.Phase != api.InstanceReady || got.ObservedGeneration != 1 || got.Runtime == nil ||
				got.Runtime.Ports["ssh"] != 2222 || got.StatusAt == nil || !got.StatusAt.Equal(now) {
				t.Fatalf("after ready: %+v", got)
			}
			ready.At = now.Add(time.Second)
			a.report(a1.ID, ready)
			var again api.Instance
			op(http.MethodGet, "/api/v1/instances/"+a1.ID, nil, &again, http.StatusOK)
			if !again.UpdatedAt.Equal(got.UpdatedAt) || !again.StatusAt.Equal(now) {
				t.Errorf("an identical report wrote: updated %v → %v, status_at %v", got.UpdatedAt, again.UpdatedAt, again.StatusAt)
			}
			op(http.MethodPost, "/api/v1/instances/"+a1.ID+"/stop", nil, &got, http.StatusOK)
			if got.DesiredState != api.DesiredStopped || got.Generation != 2 {
				t.Fatalf("after stop: %+v", got)
			}
			a.report(a1.ID, api.InstanceStatusReport{Generation: 2, Phase: api.InstanceStopped, ReasonCode: api.ReasonTerminatedByOperator})
			if st, _ := a.report(a1.ID, ready); st != http.StatusOK { // generation 1: stale
				t.Errorf("stale report: %d, want 200", st)
			}
			op(http.MethodGet, "/api/v1/instances/"+a1.ID, nil, &got, http.StatusOK)
			if got.Phase != api.InstanceStopped || got.ReasonCode != api.ReasonTerminatedByOperator || got.ObservedGeneration != 2 {
				t.Fatalf("a stale report overwrote the status: %+v", got)
			}

			// Drain wakes the node's long-poll and keeps new instances off it.
			set = set0(t, a)
			poll = a.asyncSet(set.ETag, "10s")
			var h api.Host
			op(http.MethodPost, "/api/v1/hosts/node-a/drain", nil, &h, http.StatusOK)
			if !h.Draining || h.Schedulable {
				t.Errorf("drained host view: draining %t schedulable %t", h.Draining, h.Schedulable)
			}
			if drained := waitSet(t, poll, "drain"); !drained.Draining || drained.ETag == set.ETag {
				t.Fatalf("set after drain: %+v", drained)
			}
			var eb api.ErrorBody
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "pinned", HostID: "node-a", Spec: apiSpec(1, 64)},
				&eb, http.StatusConflict)
			if eb.Error.Code != "insufficient_capacity" || !strings.Contains(eb.Error.Message, "node-a: draining") {
				t.Errorf("create on a draining host: %+v", eb.Error)
			}
			var b1 api.Instance
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "b1", Spec: apiSpec(1, 64)}, &b1, http.StatusCreated)
			if b1.HostID != "node-b" {
				t.Errorf("placed on %s while node-a drains, want node-b", b1.HostID)
			}
			op(http.MethodPost, "/api/v1/hosts/node-a/undrain", nil, &h, http.StatusOK)
			if h.Draining {
				t.Error("undrain left the host draining")
			}

			// A long-poll with nothing to change answers with the same set
			// when its wait ends: after 3/4 of it at the earliest
			// (httpapi.LongPollWait).
			set = set0(t, a)
			start := time.Now()
			if st, same := a.set(set.ETag, "300ms"); st != http.StatusOK || same.ETag != set.ETag || time.Since(start) < 225*time.Millisecond {
				t.Errorf("idle long-poll: %d after %v, etag changed %t", st, time.Since(start), same.ETag != set.ETag)
			}

			// Capacity is what hosts have minus what instances take, for
			// instance placement and the placement check alike: a1 (2 vCPU,
			// 1 GiB) on A, b1 (1 vCPU) on B.
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "huge", Spec: apiSpec(4, 1024)}, &eb, http.StatusConflict)
			if eb.Error.Code != "insufficient_capacity" || !strings.Contains(eb.Error.Message, "node-a: short 2 vCPU (need 4, free 2)") ||
				!strings.Contains(eb.Error.Message, "node-b: short 1 vCPU (need 4, free 3)") {
				t.Errorf("too big: %+v", eb.Error)
			}
			var pr api.PlacementResponse
			op(http.MethodPost, "/api/v1/placements/check", api.PlacementRequest{Resources: api.Capacity{VCPUs: 3}}, &pr, http.StatusOK)
			if pr.NodeID != "node-b" || pr.Free.VCPUs != 3 || pr.Free.MemoryMiB != 4096-64 {
				t.Errorf("placement check: %+v, want node-b with 3 vCPU, 4032 MiB free", pr)
			}
			op(http.MethodPost, "/api/v1/placements/check", api.PlacementRequest{NodeID: "node-a", Resources: api.Capacity{VCPUs: 3}}, &eb, http.StatusConflict)

			// Slots: only approved ones, each held by one instance.
			spec := apiSpec(1, 64)
			spec.Slots = []string{"slot-0"}
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "gpu1", HostID: "node-a", Spec: spec}, &eb, http.StatusConflict)
			if eb.Error.Code != "slot_unavailable" || !strings.Contains(eb.Error.Message, "slot slot-0 is not approved") {
				t.Errorf("unapproved slot: %+v", eb.Error)
			}
			if err := e.st.ApproveSlots(context.Background(), []store.Slot{{HostID: "node-a", SlotID: "slot-0", ApprovedBy: "test",
				Spec: json.RawMessage(`{"slot_index":0,"pci_address":"0000:17:00.0","fabric_device":"0000:18:00.2","nvme_device":null}`)}}); err != nil {
				t.Fatal(err)
			}
			var gpu1 api.Instance
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "gpu1", Spec: spec}, &gpu1, http.StatusCreated)
			if gpu1.HostID != "node-a" {
				t.Errorf("slot instance placed on %s, want the host that has the slot", gpu1.HostID)
			}
			// The node learns which devices to pass through.
			var devs []string
			for _, d := range set0(t, a).Instances {
				if d.ID == gpu1.ID {
					devs = d.PCIDevices
				}
			}
			if !slices.Equal(devs, []string{"0000:17:00.0", "0000:18:00.2"}) {
				t.Errorf("desired gpu1 pci_devices = %v, want the slot's GPU and fabric VF", devs)
			}
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "gpu2", HostID: "node-a", Spec: spec}, &eb, http.StatusConflict)
			if eb.Error.Code != "slot_unavailable" || !strings.Contains(eb.Error.Message, "held by instance gpu1") {
				t.Errorf("slot in use: %+v", eb.Error)
			}
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "gpu1", Spec: apiSpec(1, 64)}, &eb, http.StatusConflict)
			if eb.Error.Code != "instance_exists" {
				t.Errorf("duplicate name: %+v", eb.Error)
			}
			op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "BAD", Spec: api.InstanceSpec{}}, &eb, http.StatusUnprocessableEntity)
			if len(eb.Error.Fields) < 4 {
				t.Errorf("invalid create: %+v", eb.Error)
			}

			// Delete: desired deleted with a new generation; the record goes
			// only when the node reports Stopped at that generation.
			op(http.MethodDelete, "/api/v1/instances/"+a1.ID, nil, &got, http.StatusAccepted)
			if got.DesiredState != api.DesiredDeleted || got.Generation != 3 {
				t.Fatalf("after delete: %+v", got)
			}
			a.report(a1.ID, api.InstanceStatusReport{Generation: 2, Phase: api.InstanceStopped})
			op(http.MethodGet, "/api/v1/instances/"+a1.ID, nil, &got, http.StatusOK)
			if st, _ := a.report(a1.ID, api.InstanceStatusReport{Generation: 3, Phase: api.InstanceStopped}); st != http.StatusOK {
				t.Fatalf("final stopped report: %d", st)
			}
			op(http.MethodGet, "/api/v1/instances/"+a1.ID, nil, nil, http.StatusNotFound)
			if !e.auditHas("instance.delete", a1.ID, "removed") {
				t.Error("removal not audited")
			}
			if st, _ := a.report(a1.ID, api.InstanceStatusReport{Generation: 3, Phase: api.InstanceStopped}); st != http.StatusNotFound {
				t.Errorf("report for a removed instance: %d, want 404", st)
			}
			op(http.MethodDelete, "/api/v1/instances/gpu1?force=true", nil, nil, http.StatusOK)
			op(http.MethodGet, "/api/v1/instances/gpu1", nil, nil, http.StatusNotFound)

			// Scale: up from a template, down from the highest number, up
			// again past names still held by deleting members.
			var sr api.ScaleResponse
			op(http.MethodPost, "/api/v1/instance-groups/web/scale", api.ScaleRequest{Replicas: 1}, &eb, http.StatusUnprocessableEntity)
			op(http.MethodPost, "/api/v1/instance-groups/web/scale", api.ScaleRequest{Replicas: 3,
				Template: &api.CreateInstanceRequest{Labels: map[string]string{"tier": "web"}, Spec: apiSpec(1, 256)}}, &sr, http.StatusOK)
			if gotNames := instanceNames(sr.Created); strings.Join(gotNames, ",") != "web-1,web-2,web-3" {
				t.Fatalf("scale up created %v", gotNames)
			}
			for _, in := range sr.Created {
				if in.Group != "web" || in.Labels["tier"] != "web" {
					t.Errorf("member %+v", in)
				}
			}
			op(http.MethodPost, "/api/v1/instance-groups/web/scale", api.ScaleRequest{Replicas: 1}, &sr, http.StatusOK)
			if len(sr.Deleted) != 2 || sr.Deleted[0] != idOf(t, e, "web-3") || sr.Deleted[1] != idOf(t, e, "web-2") {
				t.Fatalf("scale down deleted %v, want web-3 and web-2", sr.Deleted)
			}
			op(http.MethodPost, "/api/v1/instance-groups/web/scale", api.ScaleRequest{Replicas: 2}, &sr, http.StatusOK)
			if gotNames := instanceNames(sr.Created); len(gotNames) != 1 || gotNames[0] != "web-4" || sr.Created[0].Spec.MemoryMiB != 256 {
				t.Fatalf("scale up from the group's own member created %+v", sr.Created)
			}
			var list []api.Instance
			op(http.MethodGet, "/api/v1/instances?group=web", nil, &list, http.StatusOK)
			live := 0
			for _, in := range list {
				if in.DesiredState != api.DesiredDeleted {
					live++
				}
			}
			if len(list) != 4 || live != 2 {
				t.Errorf("group web: %d records, %d live; want 4, 2", len(list), live)
			}
			op(http.MethodPost, "/api/v1/instance-groups/web/scale", api.ScaleRequest{Replicas: 50}, &eb, http.StatusConflict)
			op(http.MethodGet, "/api/v1/instances?group=web", nil, &list, http.StatusOK)
			if len(list) != 4 {
				t.Errorf("a scale that does not fit created %d members", len(list)-4)
			}
			if !e.auditHas("instance_group.scale", "web", "ok") {
				t.Error("scale not audited")
			}
		})
	}
}

// TestInstancesLongPollAcrossReplicas: a node's long-poll held by one
// replica is woken by instance and drain changes made through another, via
// the store's LISTEN/NOTIFY events alone.
func TestInstancesLongPollAcrossReplicas(t *testing.T) {
	if pg == nil {
		pgtest.Skip(t, pgErr)
	}
	dsn := pg.NewDatabase(t)
	r1 := startEnv(t, openPostgresDSN(t, dsn))
	r2 := startEnv(t, openPostgresDSN(t, dsn))
	n1 := startAPINode(r1, "node-x")
	n2 := &apiNode{e: r2, id: n1.id} // the same node, connected to replica 2

	set := set0(t, n2)
	poll := n2.asyncSet(set.ETag, "10s")
	time.Sleep(100 * time.Millisecond)
	var in api.Instance
	if st := r1.op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "x1", Spec: apiSpec(1, 64)}, &in); st != http.StatusCreated {
		t.Fatalf("create on replica 1: HTTP %d", st)
	}
	if got := waitSet(t, poll, "a create on the other replica"); len(got.Instances) != 1 || got.Instances[0].ID != in.ID {
		t.Fatalf("set on replica 2: %+v", got)
	}
	set = set0(t, n2)
	poll = n2.asyncSet(set.ETag, "10s")
	time.Sleep(100 * time.Millisecond)
	if st := r1.op(http.MethodPost, "/api/v1/hosts/node-x/drain", nil, nil); st != http.StatusOK {
		t.Fatalf("drain on replica 1: HTTP %d", st)
	}
	if got := waitSet(t, poll, "a drain on the other replica"); !got.Draining {
		t.Fatalf("set on replica 2 after drain: %+v", got)
	}
	if st, _ := n2.report(in.ID, api.InstanceStatusReport{Generation: 1, Phase: api.InstanceBooting}); st != http.StatusOK {
		t.Fatalf("report on replica 2: %d", st)
	}
	var got api.Instance
	if r1.op(http.MethodGet, "/api/v1/instances/x1", nil, &got); got.Phase != api.InstanceBooting {
		t.Fatalf("phase on replica 1: %s", got.Phase)
	}
}

// set0 reads a node's current set.
func set0(t *testing.T, n *apiNode) api.NodeInstances {
	t.Helper()
	st, set := n.set("", "")
	if st != http.StatusOK {
		t.Fatalf("desired set: HTTP %d", st)
	}
	return set
}

func idOf(t *testing.T, e *env, name string) string {
	t.Helper()
	var in api.Instance
	if st := e.op(http.MethodGet, "/api/v1/instances/"+name, nil, &in); st != http.StatusOK {
		t.Fatalf("get %s: HTTP %d", name, st)
	}
	return in.ID
}

func instanceNames(list []api.Instance) []string {
	out := make([]string, 0, len(list))
	for _, in := range list {
		out = append(out, in.Name)
	}
	return out
}
