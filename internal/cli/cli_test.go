package cli

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
)

// startServer runs a control plane on loopback and returns its operator
// URL and a token. seed, when given, fills the store before it starts.
func startServer(t *testing.T, seed ...func(context.Context, store.Store) error) (apiURL, token string) {
	t.Helper()
	return startServerAt(t, filepath.Join(t.TempDir(), "d.db"), seed...)
}

// startServerAt is startServer with its SQLite database at dbPath.
func startServerAt(t *testing.T, dbPath string, seed ...func(context.Context, store.Store) error) (apiURL, token string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range seed {
		if err := f(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	opLn, _ := net.Listen("tcp", "127.0.0.1:0")
	nodeLn, _ := net.Listen("tcp", "127.0.0.1:0")
	srv, err := server.New(ctx, server.Config{NodeAddr: nodeLn.Addr().String(), NodeURL: "https://" + nodeLn.Addr().String(),
		KEK: testKEK(t)}, st)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, opLn, nodeLn); close(done) }()
	t.Cleanup(func() { cancel(); <-done; st.Close() })
	<-srv.Ready()
	tok, err := srv.CreateOperatorToken(ctx, server.OperatorTokenSpec{Name: "cli-test", Role: api.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + opLn.Addr().String(), tok.Token
}

func TestCommands(t *testing.T) {
	apiURL, token := startServer(t)
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append(args, "--api", apiURL, "--token", token), &Env{Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string // in stdout for code 0, stderr otherwise
	}{
		{"create host", []string{"hosts", "create", "web-1", "--label", "rack=a"}, 0, "NODE_AGENT_BOOTSTRAP_TOKEN=drv_bt_"},
		{"create prints the CA pin", []string{"hosts", "create", "web-2"}, 0, "NODE_AGENT_CA_HASH=sha256:"},
		{"duplicate host", []string{"hosts", "create", "web-1"}, 1, "host_exists"},
		{"bad host id", []string{"hosts", "create", "Web_1!"}, 1, "host_id:"},
		{"list", []string{"hosts", "list"}, 0, "web-1"},
		{"show", []string{"hosts", "show", "web-1"}, 0, "os_family:"},
		{"show unknown", []string{"hosts", "show", "nope"}, 1, "host_not_found"},
		{"disable", []string{"hosts", "disable", "web-2"}, 0, "enabled:         false"},
		{"rotate token", []string{"hosts", "rotate-token", "web-2"}, 0, "drv_bt_"},
		{"queue a task", []string{"tasks", "run", "--node", "web-1", "--type", "diag.health_probe"}, 0, "queued tsk_"},
		{"unregistered type", []string{"tasks", "run", "--node", "web-1", "--type", "exec.shell"}, 1, "unknown task type"},
		{"bad params", []string{"tasks", "run", "--node", "web-1", "--type", "diag.health_probe", "--params", "{x"}, 1, "not valid JSON"},
		{"task list", []string{"tasks", "list", "--node", "web-1"}, 0, "diag.health_probe"},
		{"placement: nothing schedulable", []string{"hosts", "place", "--vcpus", "2"}, 1, "insufficient_capacity"},
		{"token list", []string{"token", "list"}, 0, "cli-test"},
		{"audit", []string{"audit", "--target", "web-1"}, 0, "host.create"},
		{"keys rotate", []string{"keys", "rotate", "--yes"}, 0, "active signing key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := run(tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out, errOut)
			}
			where := out
			if code != 0 {
				where = errOut
			}
			if !strings.Contains(where, tt.contains) {
				t.Fatalf("output lacks %q:\nstdout: %s\nstderr: %s", tt.contains, out, errOut)
			}
		})
	}
	// A wrong token is refused with the API's code.
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"hosts", "list", "--api", apiURL, "--token", "drv_op_x"}, &Env{Stdout: &out, Stderr: &errb}); code != 1 || !strings.Contains(errb.String(), "operator_token_invalid") {
		t.Fatalf("wrong token: exit %d, %s", code, errb.String())
	}
}

func TestDefaultHostID(t *testing.T) {
	id := defaultHostID()
	if id == "" || strings.ToLower(id) != id || strings.ContainsAny(id, " /") {
		t.Fatalf("defaultHostID() = %q", id)
	}
}
