package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// fakeTasksAPI serves POST /api/v1/tasks and GET /api/v1/tasks/{id}: each
// GET reveals one more of events, then the result.
type fakeTasksAPI struct {
	mu     sync.Mutex
	req    api.EnqueueTaskRequest
	events []api.TaskEvent
	result api.TaskResult
	shown  int
}

func (f *fakeTasksAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := api.Task{ID: "tsk_1", NodeID: "gpu-1", Type: task.TypeImagePull, State: api.TaskQueued, CorrelationID: "cid-1"}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/tasks":
		if err := json.NewDecoder(r.Body).Decode(&f.req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/tasks/tsk_1":
		if r.URL.Query().Get("wait") == "" {
			http.Error(w, "want ?wait", http.StatusBadRequest)
			return
		}
		t.State = api.TaskRunning
		if f.shown < len(f.events) {
			f.shown++
		} else {
			res := f.result
			t.Result = &res
			t.State = api.TaskSucceeded
			if res.Status == api.ResultFailed {
				t.State = api.TaskFailed
			}
		}
		t.Events = f.events[:f.shown]
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(t)
}

// TestImagesPull: drover images pull splits REF@DIGEST into image.pull's
// params (with --auth-secret and --pull-timeout), queues it for --node and
// prints each phase as it arrives, then the pulled image; a failed pull
// exits 1 with the task's error code and message.
func TestImagesPull(t *testing.T) {
	defer func(d time.Duration) { pollEvery = d }(pollEvery)
	pollEvery = 10 * time.Millisecond
	dg := "sha256:" + strings.Repeat("ab", 32)
	at := time.Now()
	f := &fakeTasksAPI{events: []api.TaskEvent{{Phase: "started", Status: "started", At: at},
		{Phase: "resolve", Status: "succeeded", DurationMS: 21, At: at},
		{Phase: "layer 301eec4820c4 download", Status: "succeeded", DurationMS: 7, At: at},
		{Phase: "layer 301eec4820c4 extract", Status: "succeeded", DurationMS: 160, At: at},
		{Phase: "verify", Status: "succeeded", DurationMS: 5, At: at}},
		result: api.TaskResult{Status: api.ResultSucceeded, Timings: map[string]int64{"total_ms": 200},
			Output: json.RawMessage(`{"ref":"reg.example/app:v1","image_id":"sha256:feed","layers":[{"id":"301eec4820c4","status":"Pull complete"}]}`)}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"images", "pull", "--node", "gpu-1", "reg.example/app:v1@" + dg,
		"--auth-secret", "reg-cred", "--pull-timeout", "2m", "--api", srv.URL, "--token", "t"}, &Env{Stdout: &out, Stderr: &errb})
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
	}
	var p task.ImagePullParams
	if err := json.Unmarshal(f.req.Params, &p); err != nil || f.req.Type != task.TypeImagePull || f.req.NodeID != "gpu-1" ||
		p != (task.ImagePullParams{Ref: "reg.example/app:v1", Digest: dg, RegistryAuth: "reg-cred", TimeoutSeconds: 120}) {
		t.Errorf("request %+v params %+v %v", f.req, p, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"resolve", "layer 301eec4820c4 download", "layer 301eec4820c4 extract", "verify", "pulled reg.example/app:v1@" + dg}
	if len(lines) != len(want) {
		t.Fatalf("stdout:\n%s", out.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("line %d %q, want %q", i, lines[i], w)
		}
	}
	if !strings.Contains(lines[1], "7ms") || !strings.Contains(lines[4], "image sha256:feed, 1 layers") {
		t.Errorf("stdout:\n%s", out.String())
	}
	if !strings.Contains(errb.String(), "queued tsk_1 for gpu-1") {
		t.Errorf("stderr: %s", errb.String())
	}

	f.mu.Lock()
	f.shown = 0
	f.events = []api.TaskEvent{{Phase: "resolve", Status: "succeeded", DurationMS: 3, At: at},
		{Phase: "verify", Status: "failed", DurationMS: 1, Message: "digest mismatch", At: at}}
	f.result = api.TaskResult{Status: api.ResultFailed, Error: &api.ResultError{Code: "image_pull_failed",
		Message: "pull reg.example/app:v1: digest mismatch: the registry served reg.example/app@sha256:1, the pinned digest is " + dg}}
	f.mu.Unlock()
	out.Reset()
	errb.Reset()
	code = Run(context.Background(), []string{"images", "pull", "--node", "gpu-1", "reg.example/app:v1@" + dg,
		"--api", srv.URL, "--token", "t"}, &Env{Stdout: &out, Stderr: &errb})
	if code != 1 || !strings.Contains(errb.String(), "image_pull_failed: pull reg.example/app:v1: digest mismatch") ||
		!strings.Contains(out.String(), "verify") {
		t.Errorf("failed pull: exit %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
	}
}
