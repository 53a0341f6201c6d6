package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/node/runtime/docker/dockertest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestImagePullTaskThroughControlPlane: an operator queues image.pull for
// a real agent running containers on a private dockerd; GET
// /api/v1/tasks/{id} shows the pull as phases (resolve, the layer's
// download and extract, verify, each with a duration) and the result
// names the image id. A container instance with that image then starts
// from the engine's cache: the registry serves no blob again. A pinned
// digest the registry does not serve fails the task with
// image_pull_failed naming both digests.
func TestImagePullTaskThroughControlPlane(t *testing.T) {
	dockertest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var blobGets atomic.Int64
	reg := ocitest.StartRegistry(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
				blobGets.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	})
	defer reg.Close()
	img, err := reg.Push("drover/busybox", "v1", "")
	if err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, openSQLite(t))
	startContainerHost(ctx, t, e, "box-1", reg.Host)

	pull := func(params string) api.Task {
		t.Helper()
		var q api.Task
		if st := e.op(http.MethodPost, "/api/v1/tasks", api.EnqueueTaskRequest{NodeID: "box-1", Type: task.TypeImagePull,
			Params: json.RawMessage(params)}, &q); st != http.StatusCreated && st != http.StatusAccepted && st != http.StatusOK {
			t.Fatalf("enqueue image.pull: HTTP %d", st)
		}
		deadline := time.Now().Add(60 * time.Second)
		for !q.State.Terminal() && time.Now().Before(deadline) {
			e.op(http.MethodGet, "/api/v1/tasks/"+q.ID+"?wait=10s", nil, &q)
		}
		if !q.State.Terminal() || q.Result == nil {
			t.Fatalf("image.pull %s still %s", q.ID, q.State)
		}
		return q
	}

	got := pull(fmt.Sprintf(`{"ref":%q,"digest":%q}`, img.Ref, img.Digest))
	if got.State != api.TaskSucceeded {
		t.Fatalf("image.pull: %s %+v events %+v", got.State, got.Result.Error, got.Events)
	}
	var names []string
	for _, ev := range got.Events {
		if ev.Phase == "started" {
			continue
		}
		names = append(names, ev.Phase)
		if ev.Status != "succeeded" || ev.DurationMS < 0 {
			t.Errorf("event %+v", ev)
		}
	}
	if len(names) != 4 || names[0] != "resolve" || !strings.HasSuffix(names[1], " download") ||
		!strings.HasSuffix(names[2], " extract") || names[3] != "verify" ||
		strings.TrimSuffix(names[1], " download") != strings.TrimSuffix(names[2], " extract") {
		t.Errorf("phases %q, want resolve, layer X download, layer X extract, verify", names)
	}
	var out task.ImagePullOutput
	if err := json.Unmarshal(got.Result.Output, &out); err != nil || !strings.HasPrefix(out.ImageID, "sha256:") ||
		len(out.Layers) != 1 || out.Engine == "" {
		t.Errorf("output %s: %v", got.Result.Output, err)
	}
	if _, ok := got.Result.Timings["resolve_ms"]; !ok {
		t.Errorf("timings %v", got.Result.Timings)
	}
	pulled := blobGets.Load()
	if pulled == 0 {
		t.Fatal("the registry served no blob")
	}

	// An instance with the image starts from the engine's cache.
	port := freeLoopbackPort(t)
	spec := api.InstanceSpec{Runtime: api.RuntimeDocker, VCPUs: 1, MemoryMiB: 64,
		Container: &api.ContainerSpec{Image: img.Ref, Digest: img.Digest,
			Command: []string{"/bin/busybox", "httpd", "-f", "-p", fmt.Sprintf("127.0.0.1:%d", port)}},
		Network:   api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: port}}},
		Readiness: api.Readiness{TCPPort: port}, GracefulTimeout: api.Duration(2 * time.Second)}
	in := e.createInstance(api.CreateInstanceRequest{Name: "prepulled", Spec: spec})
	e.waitPhase(in.ID, api.InstanceReady, "", 60*time.Second)
	if n := blobGets.Load(); n != pulled {
		t.Errorf("the instance's create fetched %d blobs again", n-pulled)
	}

	wrong := "sha256:" + strings.Repeat("0", 64)
	got = pull(fmt.Sprintf(`{"ref":%q,"digest":%q}`, img.Ref, wrong))
	if r := got.Result; got.State != api.TaskFailed || r.Error == nil || r.Error.Code != string(api.ReasonImagePullFailed) ||
		!strings.Contains(r.Error.Message, img.Digest) || !strings.Contains(r.Error.Message, wrong) {
		t.Errorf("digest mismatch: %s %+v", got.State, got.Result.Error)
	}
	if last := got.Events[len(got.Events)-1]; last.Phase != "verify" || last.Status != "failed" {
		t.Errorf("digest mismatch events %+v", got.Events)
	}
}
