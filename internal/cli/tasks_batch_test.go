package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

func TestTasksRunBatch(t *testing.T) {
	apiURL, token := startServer(t)
	run := func(stdin string, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append(args, "--api", apiURL, "--token", token),
			&Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	if code, _, errOut := run("", "hosts", "create", "web-1"); code != 0 {
		t.Fatalf("hosts create: %s", errOut)
	}
	file := filepath.Join(t.TempDir(), "batch.jsonl")
	lines := `{"node_id":"web-1","type":"diag.echo","params":{"message":"a"}}

{"node_id":"web-1","type":"diag.echo","params":{"message":"b"},"correlation_id":"mine"}
`
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("", "tasks", "run", "--batch", file, "--json")
	if code != 0 {
		t.Fatalf("batch from JSON lines: exit %d: %s", code, errOut)
	}
	var tasks []api.Task
	if err := json.Unmarshal([]byte(out), &tasks); err != nil || len(tasks) != 2 ||
		!strings.HasPrefix(tasks[0].CorrelationID, "batch-") || tasks[1].CorrelationID != "mine" {
		t.Fatalf("batch answer %v: %s", err, out)
	}

	array := `[{"node_id":"web-1","type":"diag.echo"},{"node_id":"web-1","type":"diag.echo"},{"node_id":"web-1","type":"diag.echo"}]`
	code, _, errOut = run(array, "tasks", "run", "--batch", "-", "--wait", "--timeout", "1s")
	if code != 1 || !strings.Contains(errOut, "0/3 final: queued 3") || !strings.Contains(errOut, "3 of 3 tasks not final") {
		t.Fatalf("batch --wait with no agent: exit %d: %s", code, errOut)
	}

	bad := `[{"node_id":"web-1","type":"diag.echo"},{"node_id":"nope","type":"diag.echo"}]`
	code, _, errOut = run(bad, "tasks", "run", "--batch", "-")
	if code != 1 || !strings.Contains(errOut, "items[1].node_id") {
		t.Fatalf("bad batch: exit %d: %s", code, errOut)
	}
	if code, _, errOut = run("", "tasks", "run", "--type", "diag.echo"); code != 1 || !strings.Contains(errOut, "--node and --type are required") {
		t.Fatalf("no node: exit %d: %s", code, errOut)
	}
}
