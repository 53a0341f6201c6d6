package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestMicroVMVolumesTCG: a named volume end to end under TCG. A microVM
// created through the control plane with container.volumes appends to
// the volume and serves; volume.list shows the instance holding it;
// volume.delete is refused (volume_in_use) and a second instance asking
// for it is Failed with volume_attach_failed, both naming the holder.
// The instance is deleted (the volume stays), a new one mounting it
// read-only becomes Ready only if it reads the first one's line, and once
// it is gone volume.delete removes the volume.
func TestMicroVMVolumesTCG(t *testing.T) {
	t0 := time.Now()
	h := startMicroVMHost(t, "mv-1", nil)
	e, img, rtDir := h.e, h.img, h.rtDir
	t.Logf("setup took %v", time.Since(t0).Round(time.Millisecond))

	spec := func(script string, vol api.VolumeMount) api.InstanceSpec {
		return api.InstanceSpec{Runtime: api.RuntimeMicroVM, VCPUs: 1, MemoryMiB: 256,
			Container: &api.ContainerSpec{Image: img.Ref, Digest: img.Digest, Command: []string{"/bin/sh", "-c", script},
				Volumes: []api.VolumeMount{vol}},
			Network:   api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 8080}}},
			Readiness: api.Readiness{TCPPort: 8080, HTTPPath: "/health", Timeout: api.Duration(2 * time.Minute)}}
	}
	runTask := func(typ string, params any) api.Task {
		t.Helper()
		return e.waitTask(e.enqueue("mv-1", typ, params).ID, time.Minute)
	}
	list := func() []api.Volume {
		t.Helper()
		tk := runTask(task.TypeVolumeList, task.VolumeListParams{})
		var out task.VolumeListOutput
		if tk.State != api.TaskSucceeded || json.Unmarshal(tk.Result.Output, &out) != nil {
			t.Fatalf("volume.list: %s %+v", tk.State, tk.Result)
		}
		return out.Volumes
	}
	vol := api.VolumeMount{Source: "pgdata", Target: "/data", SizeGiB: 1}

	w := e.createInstance(api.CreateInstanceRequest{Name: "writer", HostID: "mv-1",
		Spec: spec("echo persisted >> /data/f && exec /testserver", vol)})
	e.waitPhase(w.ID, api.InstanceReady, "", 3*time.Minute)
	if vs := list(); len(vs) != 1 || vs[0].Name != "pgdata" || vs[0].SizeGiB != 1 || vs[0].Format != "raw" ||
		len(vs[0].Holders) != 1 || vs[0].Holders[0] != w.ID {
		t.Fatalf("volume.list while the writer runs: %+v", vs)
	}
	tk := runTask(task.TypeVolumeDelete, task.VolumeDeleteParams{Name: "pgdata"})
	if tk.State != api.TaskFailed || tk.Result == nil || tk.Result.Error == nil || tk.Result.Error.Code != "volume_in_use" ||
		!strings.Contains(tk.Result.Error.Message, w.ID) {
		t.Fatalf("volume.delete while attached: %s %+v", tk.State, tk.Result)
	}
	second := e.createInstance(api.CreateInstanceRequest{Name: "second", HostID: "mv-1", Spec: spec("exec /testserver", vol)})
	held := e.waitPhase(second.ID, api.InstanceFailed, api.ReasonVolumeAttachFailed, 2*time.Minute)
	if !strings.Contains(held.Message, "held by instance "+w.ID) {
		t.Errorf("second instance's message %q does not name the holder", held.Message)
	}

	// Recreated: the writer goes, the volume stays; a reader mounting it
	// read-only is Ready only if it finds the writer's line.
	for _, id := range []string{w.ID, second.ID} {
		if st := e.op(http.MethodDelete, "/api/v1/instances/"+id, nil, nil); st != http.StatusAccepted {
			t.Fatalf("delete %s: HTTP %d", id, st)
		}
		e.waitGone(id, 2*time.Minute)
	}
	if vs := list(); len(vs) != 1 || len(vs[0].Holders) != 0 {
		t.Fatalf("volume.list after the writer's delete: %+v", vs)
	}
	ro := vol
	ro.ReadOnly = true
	r := e.createInstance(api.CreateInstanceRequest{Name: "reader", HostID: "mv-1",
		Spec: spec(`test "$(cat /data/f)" = persisted && exec /testserver`, ro)})
	e.waitPhase(r.ID, api.InstanceReady, "", 3*time.Minute)
	if st := e.op(http.MethodDelete, "/api/v1/instances/"+r.ID, nil, nil); st != http.StatusAccepted {
		t.Fatalf("delete reader: HTTP %d", st)
	}
	e.waitGone(r.ID, 2*time.Minute)

	tk = runTask(task.TypeVolumeDelete, task.VolumeDeleteParams{Name: "pgdata"})
	var del task.VolumeDeleteOutput
	if tk.State != api.TaskSucceeded || json.Unmarshal(tk.Result.Output, &del) != nil || !del.Deleted {
		t.Fatalf("volume.delete: %s %+v", tk.State, tk.Result)
	}
	if vs := list(); len(vs) != 0 {
		t.Errorf("volume.list after delete: %+v", vs)
	}
	if procs := qemuProcesses(t, rtDir); len(procs) != 0 {
		t.Errorf("qemu processes left: %v", procs)
	}
	t.Logf("whole test %v", time.Since(t0).Round(time.Millisecond))
}
