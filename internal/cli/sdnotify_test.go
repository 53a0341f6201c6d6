package cli

import (
	"context"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/sdnotify/sdnotifytest"
)

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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		var out strings.Builder
		code := Run(ctx, []string{"server", "--store", "sqlite:" + filepath.Join(t.TempDir(), "d.db"),
			"--insecure-plaintext-keys", "--listen", "127.0.0.1:0", "--node-listen", "127.0.0.1:0", "--log-format", "json"},
			&Env{Stdout: &out, Stderr: &out})
		if code != 0 {
			t.Errorf("drover server exit %d: %s", code, out.String())
		}
		done <- code
	}()
	m, _ := sock.Wait(t, "READY=1", 20*time.Second)
	st := statusRE.FindStringSubmatch(m)
	if st == nil {
		t.Fatalf("READY=1 without status naming both bound ports: %q", m)
	}
	op, nodeURL := st[1], st[2]
	if _, port, _ := net.SplitHostPort(strings.TrimPrefix(nodeURL, "https://")); port == "0" {
		t.Fatalf("node URL %s names port 0, not the bound port", nodeURL)
	}
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(nodeURL, "https://"), 5*time.Second)
	if err != nil {
		t.Fatalf("node listener at %s: %v", nodeURL, err)
	}
	c.Close()
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

var statusRE = regexp.MustCompile(`STATUS=serving: operator API on (127\.0\.0\.1:[1-9][0-9]*), node API at (https://127\.0\.0\.1:[0-9]+)`)

func TestNotifyDialable(t *testing.T) {
	for in, want := range map[string]string{":8080": "127.0.0.1:8080", "0.0.0.0:8080": "127.0.0.1:8080",
		"[::]:8080": "[::1]:8080", "10.0.0.1:8080": "10.0.0.1:8080", "cp.example:8080": "cp.example:8080"} {
		if got := dialable(in); got != want {
			t.Errorf("dialable(%q) = %q, want %q", in, got, want)
		}
	}
}
