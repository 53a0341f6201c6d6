package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

// fakeImage is an image reference the mock runtime accepts without fetching.
var fakeImage = api.Artifact{URL: "https://images.example/base.qcow2", SHA256: strings.Repeat("ab", 32)}

// waitInstance polls an instance until cond holds.
func (e *env) waitInstance(id string, within time.Duration, what string, cond func(api.Instance, int) bool) api.Instance {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var in api.Instance
		st := e.op(http.MethodGet, "/api/v1/instances/"+id, nil, &in)
		if cond(in, st) {
			return in
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("instance %s: want %s after %s; last HTTP %d phase %s reason %s message %q",
				id, what, within, st, in.Phase, in.ReasonCode, in.Message)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) waitPhase(id string, phase api.InstancePhase, reason api.ReasonCode, within time.Duration) api.Instance {
	e.t.Helper()
	return e.waitInstance(id, within, fmt.Sprintf("phase %s reason %q", phase, reason), func(in api.Instance, st int) bool {
		return st == http.StatusOK && in.Phase == phase && in.ReasonCode == reason
	})
}

func (e *env) waitGone(id string, within time.Duration) {
	e.t.Helper()
	e.waitInstance(id, within, "record removed", func(_ api.Instance, st int) bool { return st == http.StatusNotFound })
}

// createInstance creates an instance and returns it.
func (e *env) createInstance(req api.CreateInstanceRequest) api.Instance {
	e.t.Helper()
	var in api.Instance
	if st := e.op(http.MethodPost, "/api/v1/instances", req, &in); st != http.StatusCreated {
		e.t.Fatalf("create instance %s: HTTP %d", req.Name, st)
	}
	return in
}

// TestInstancesOnMockRuntime drives declared instances through the control
// plane to an agent whose reconciler runs the mock runtime: create, scale up
// and down, drain and undrain, stop, a failure reason, delete.
func TestInstancesOnMockRuntime(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t))
			bt := e.createHost("mock-1")
			rt := mock.New(mock.Options{})
			e.startAgent("mock-1", bt.Token, agentOpts{rt: rt})
			e.waitHostStatus("mock-1", api.HostHealthy, 10*time.Second)
			waitCapacity(t, e, "mock-1")

			spec := api.InstanceSpec{Image: fakeImage, VCPUs: 1, MemoryMiB: 128}
			web := e.createInstance(api.CreateInstanceRequest{Name: "solo", HostID: "mock-1", Spec: spec})
			if web.Phase != api.InstancePending || web.HostID != "mock-1" {
				t.Fatalf("created instance = %+v, want Pending on mock-1", web)
			}
			ready := e.waitPhase(web.ID, api.InstanceReady, "", 10*time.Second)
			if ready.Runtime == nil || ready.Runtime.Runtime != "mock" || ready.ObservedGeneration != ready.Generation {
				t.Errorf("ready instance runtime/generation = %+v / %d of %d", ready.Runtime, ready.ObservedGeneration, ready.Generation)
			}

			// Scale a group up to 3, then down to 1.
			var sr api.ScaleResponse
			if st := e.op(http.MethodPost, "/api/v1/instance-groups/web/scale", api.ScaleRequest{Replicas: 3,
				Template: &api.CreateInstanceRequest{HostLabels: nil, Spec: spec}}, &sr); st != http.StatusOK {
				t.Fatalf("scale up: HTTP %d", st)
			}
			if len(sr.Created) != 3 {
				t.Fatalf("scale up created %d, want 3", len(sr.Created))
			}
			for _, in := range sr.Created {
				e.waitPhase(in.ID, api.InstanceReady, "", 10*time.Second)
			}
			if got := len(rt.Running()); got != 4 {
				t.Errorf("mock runs %d instances, want 4", got)
			}
			if st := e.op(http.MethodPost, "/api/v1/instance-groups/web/scale", api.ScaleRequest{Replicas: 1}, &sr); st != http.StatusOK {
				t.Fatalf("scale down: HTTP %d", st)
			}
			if len(sr.Deleted) != 2 {
				t.Fatalf("scale down deleted %v, want 2", sr.Deleted)
			}
			for _, id := range sr.Deleted {
				e.waitGone(id, 10*time.Second)
			}
			var list []api.Instance
			e.op(http.MethodGet, "/api/v1/instances?group=web", nil, &list)
			if len(list) != 1 || list[0].Name != "web-1" {
				t.Errorf("group web after scale down = %v, want web-1 only", names(list))
			}

			// Drain stops everything with node_draining; undrain brings it back.
			if st := e.op(http.MethodPost, "/api/v1/hosts/mock-1/drain", nil, nil); st != http.StatusOK {
				t.Fatalf("drain: HTTP %d", st)
			}
			e.waitPhase(web.ID, api.InstanceStopped, api.ReasonNodeDraining, 10*time.Second)
			if st := e.op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "late", Spec: spec}, nil); st != http.StatusConflict {
				t.Errorf("create on a draining-only fleet: HTTP %d, want 409", st)
			}
			if st := e.op(http.MethodPost, "/api/v1/hosts/mock-1/undrain", nil, nil); st != http.StatusOK {
				t.Fatalf("undrain: HTTP %d", st)
			}
			e.waitPhase(web.ID, api.InstanceReady, "", 10*time.Second)

			// Operator stop, then start.
			e.op(http.MethodPost, "/api/v1/instances/"+web.ID+"/stop", nil, nil)
			e.waitPhase(web.ID, api.InstanceStopped, api.ReasonTerminatedByOperator, 10*time.Second)
			e.op(http.MethodPost, "/api/v1/instances/"+web.ID+"/start", nil, nil)
			e.waitPhase(web.ID, api.InstanceReady, "", 10*time.Second)

			// A failure carries its reason code to the operator.
			bad := spec
			bad.Secrets = []string{"db-password"}
			failed := e.createInstance(api.CreateInstanceRequest{Name: "needs-secret", HostID: "mock-1", Spec: bad})
			f := e.waitPhase(failed.ID, api.InstanceFailed, api.ReasonSecretsMissing, 10*time.Second)
			if !strings.Contains(f.Message, "db-password") {
				t.Errorf("secrets_missing message %q does not name the secret", f.Message)
			}

			// The agent accounts for what its instances hold: a Failed
			// instance that is still desired running keeps its share (it is
			// retried), as the control plane's placement counts it.
			var capa api.Host
			deadline := time.Now().Add(5 * time.Second)
			for {
				e.op(http.MethodGet, "/api/v1/hosts/mock-1", nil, &capa)
				if capa.Capacity != nil && capa.Capacity.Allocated.VCPUs == 3 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("host allocated = %+v, want 3 vCPUs (solo, web-1, needs-secret)", capa.Capacity)
				}
				time.Sleep(50 * time.Millisecond)
			}

			// Delete: Draining → Stopped, then the record goes.
			for _, id := range []string{web.ID, failed.ID, list[0].ID} {
				if st := e.op(http.MethodDelete, "/api/v1/instances/"+id, nil, nil); st != http.StatusAccepted {
					t.Fatalf("delete %s: HTTP %d", id, st)
				}
				e.waitGone(id, 10*time.Second)
			}
			if r := rt.Running(); len(r) != 0 {
				t.Errorf("mock still runs %v after deleting everything", r)
			}
		})
	}
}

func names(list []api.Instance) []string {
	var out []string
	for _, in := range list {
		out = append(out, in.Name)
	}
	return out
}

// waitCapacity waits until the host has reported capacity (placement needs it).
func waitCapacity(t testing.TB, e *env, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var h api.Host
		e.op(http.MethodGet, "/api/v1/hosts/"+id, nil, &h)
		if h.Capacity != nil && h.Capacity.Total.VCPUs > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %s reported no capacity", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
