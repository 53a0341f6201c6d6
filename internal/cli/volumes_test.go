package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestVolumesCommands: drover volumes list queues volume.list for --host
// and prints a table; delete needs --yes without a terminal, queues
// volume.delete with the name, and exits 1 with the task's code and
// message when the node refuses (volume_in_use); a name with a path
// trick is refused before anything is queued.
func TestVolumesCommands(t *testing.T) {
	defer func(d time.Duration) { pollEvery = d }(pollEvery)
	pollEvery = 10 * time.Millisecond
	f := &fakeTasksAPI{result: api.TaskResult{Status: api.ResultSucceeded,
		Output: json.RawMessage(`{"volumes":[{"name":"pgdata","format":"raw","size_gib":10,"created_at":"2026-01-02T03:04:05Z","holders":["db-1"]},{"name":"cache","format":"qcow2","size_gib":1,"created_at":"2026-01-02T03:04:05Z"}]}`)}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append(args, "--api", srv.URL, "--token", "t"), &Env{Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}

	code, out, errs := run("volumes", "list", "--host", "gpu-1")
	if code != 0 || f.req.Type != task.TypeVolumeList || f.req.NodeID != "gpu-1" {
		t.Fatalf("list: exit %d, request %+v\n%s%s", code, f.req, out, errs)
	}
	for _, want := range []string{"NAME", "pgdata", "10 GiB", "db-1", "cache", "qcow2"} {
		if !strings.Contains(out, want) {
			t.Errorf("list output lacks %q:\n%s", want, out)
		}
	}

	f.req = api.EnqueueTaskRequest{}
	if code, _, errs = run("volumes", "delete", "--host", "gpu-1", "pgdata"); code != 1 || !strings.Contains(errs, "--yes") || f.req.Type != "" {
		t.Errorf("delete without --yes: exit %d, request %+v: %s", code, f.req, errs)
	}
	if code, _, errs = run("volumes", "delete", "--host", "gpu-1", "--yes", "../etc"); code != 1 || !strings.Contains(errs, "not a volume name") || f.req.Type != "" {
		t.Errorf("delete ../etc: exit %d, request %+v: %s", code, f.req, errs)
	}

	f.mu.Lock()
	f.shown = 0
	f.result = api.TaskResult{Status: api.ResultFailed, Error: &api.ResultError{Code: "volume_in_use",
		Message: "volume pgdata: volume is attached to an instance: held by instance db-1 (destroy it first)"}}
	f.mu.Unlock()
	code, _, errs = run("volumes", "delete", "--host", "gpu-1", "--yes", "pgdata")
	var p task.VolumeDeleteParams
	_ = json.Unmarshal(f.req.Params, &p)
	if code != 1 || f.req.Type != task.TypeVolumeDelete || p.Name != "pgdata" || !strings.Contains(errs, "volume_in_use: volume pgdata") {
		t.Errorf("delete while held: exit %d, request %+v: %s", code, f.req, errs)
	}

	f.mu.Lock()
	f.shown = 0
	f.result = api.TaskResult{Status: api.ResultSucceeded, Output: json.RawMessage(`{"name":"pgdata","deleted":true}`)}
	f.mu.Unlock()
	if code, out, errs = run("volumes", "delete", "--node", "gpu-1", "-y", "pgdata"); code != 0 || !strings.Contains(out, "deleted volume pgdata on gpu-1") {
		t.Errorf("delete: exit %d: %s%s", code, out, errs)
	}
}
