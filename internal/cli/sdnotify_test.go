package cli

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/sdnotify/sdnotifytest"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestNotifyServer: `drover server` under systemd (Type=notify) says
// READY=1 once both listeners are up, pings the watchdog while its
// operator listener answers, and says STOPPING=1 when it stops.
func TestNotifyServer(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	t.Setenv("NOTIFY_SOCKET", sock.Path)
	t.Setenv("WATCHDOG_USEC", "400000")
	t.Setenv("WATCHDOG_PID", "")
	t.Setenv("DROVER_KEK_FILE", "")
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	op, node := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		var out strings.Builder
		code := Run(ctx, []string{"server", "--store", "sqlite:" + filepath.Join(t.TempDir(), "d.db"),
			"--insecure-plaintext-keys", "--listen", op, "--node-listen", node, "--log-format", "json"},
			&Env{Stdout: &out, Stderr: &out})
		if code != 0 {
			t.Errorf("drover server exit %d: %s", code, out.String())
		}
		done <- code
	}()
	m, _ := sock.Wait(t, "READY=1", 20*time.Second)
	if !strings.Contains(m, "STATUS=serving: operator API on "+op) {
		t.Fatalf("READY=1 without status: %q", m)
	}
	// READY comes after the listeners: the operator listener answers.
	if err := answers(ctx, "http://"+op+"/healthz"); err != nil {
		t.Fatalf("ready but %v", err)
	}
	sock.Wait(t, "WATCHDOG=1", 5*time.Second)
	cancel()
	sock.Wait(t, "STOPPING=1", 5*time.Second)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("server did not stop")
	}
}

func TestNotifyDialable(t *testing.T) {
	for in, want := range map[string]string{":8080": "127.0.0.1:8080", "0.0.0.0:8080": "127.0.0.1:8080",
		"[::]:8080": "[::1]:8080", "10.0.0.1:8080": "10.0.0.1:8080", "cp.example:8080": "cp.example:8080"} {
		if got := dialable(in); got != want {
			t.Errorf("dialable(%q) = %q, want %q", in, got, want)
		}
	}
}
