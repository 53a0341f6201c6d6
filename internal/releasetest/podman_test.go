package releasetest

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
)

// freePort returns a TCP port nobody listens on now, outside the
// ephemeral range (testutil.FreePort).
func freePort(t *testing.T) int { return testutil.FreePort(t) }

// copyFile copies src to dst, creating dst's directory.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestContainerImage builds deploy/Containerfile with podman (a private
// storage root, vfs, runc and cgroupfs: what this kind of CI machine
// supports), runs the image against SQLite on the host network, waits for
// /healthz, checks the server runs as uid 65532 and that the image's
// HEALTHCHECK passes (podman healthcheck run).
func TestContainerImage(t *testing.T) {
	dir := release(t)
	need(t, "podman", "runc")
	root := repoRoot(t)
	// The build context: the files the Containerfile copies, laid out as in
	// the repository (a small context instead of the whole checkout).
	ctx := t.TempDir()
	for _, f := range []string{"deploy/Containerfile", "deploy/container/passwd", "deploy/container/group", "deploy/container/state/.keep"} {
		copyFile(t, filepath.Join(root, f), filepath.Join(ctx, f))
	}
	copyFile(t, filepath.Join(dir, "bin/linux-amd64/drover"), filepath.Join(ctx, "dist/bin/linux-amd64/drover"))

	store := t.TempDir()
	podman := func(args ...string) *exec.Cmd {
		base := []string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"),
			"--storage-driver", "vfs", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"}
		return exec.Command("podman", append(base, args...)...)
	}
	t.Cleanup(func() {
		_ = podman("rm", "-f", "-a").Run()
	})
	// Machine limits: no CAP_SYS_RESOURCE, so ulimits stay at most 1024.
	ulimits := []string{"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}
	build := podman(append([]string{"build", "--format", "docker", "-f", "deploy/Containerfile", "-t", "localhost/drover:test"}, append(ulimits, ctx)...)...)
	build.Dir = ctx
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	hc, err := podman("image", "inspect", "--format", "{{.HealthCheck.Test}} {{.Config.User}}", "localhost/drover:test").CombinedOutput()
	if err != nil || !strings.Contains(string(hc), "/drover healthcheck") || !strings.Contains(string(hc), "65532:65532") {
		t.Errorf("image healthcheck and user: %s %v", hc, err)
	}

	// The key-encryption key, readable by the container's uid only.
	kek := filepath.Join(t.TempDir(), "kek")
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := os.WriteFile(kek, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(kek, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	port, nodePort := freePort(t), freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", port)
	args := append([]string{"run", "-d", "--name", "drover-test", "--network", "host", "--health-interval", "disable",
		"-e", "DROVER_STORE=sqlite:/var/lib/drover/drover.db",
		"-e", fmt.Sprintf("DROVER_LISTEN=127.0.0.1:%d", port),
		"-e", fmt.Sprintf("DROVER_NODE_LISTEN=127.0.0.1:%d", nodePort),
		"-e", "DROVER_HEALTHCHECK_URL=" + url,
		"-v", kek + ":/run/secrets/drover-kek:ro"}, ulimits...)
	if out, err := podman(append(args, "localhost/drover:test")...).CombinedOutput(); err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			logs, _ := podman("logs", "drover-test").CombinedOutput()
			t.Fatalf("%s did not answer 200 within 60s (%v); container logs:\n%s", url, err, logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	pid, err := podman("inspect", "--format", "{{.State.Pid}}", "drover-test").Output()
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Uid:") && strings.Fields(line)[1] != "65532" {
			t.Errorf("the server runs as %q, want uid 65532", line)
		}
	}
	if out, err := podman("healthcheck", "run", "drover-test").CombinedOutput(); err != nil {
		t.Errorf("podman healthcheck run: %v\n%s", err, out)
	}
	if out, err := podman("exec", "drover-test", "/drover", "version").CombinedOutput(); err != nil ||
		!strings.HasPrefix(string(out), "drover "+testVersion+"\n") {
		t.Errorf("drover version in the image: %v\n%s", err, out)
	}
}
