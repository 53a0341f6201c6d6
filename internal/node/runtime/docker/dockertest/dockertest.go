//go:build linux

// Package dockertest owns what the container runtime's tests need from the
// host: a Docker Engine (Debian's docker.io dockerd) started on a private
// socket in a temporary directory with its own data and exec roots, no
// iptables, no bridge and the vfs storage driver, so it touches nothing
// of the host's; an OCI registry on loopback (go-containerregistry's
// in-memory registry) that the engine trusts as insecure; and test images
// built here from /bin/busybox (Debian's busybox-static) and a static Go
// HTTP server (testserver), pushed to that registry, so pulls use the real
// registry protocol without a network (the registry and images are
// ocitest's). It must not be imported outside tests.
package dockertest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/testutil"
)

// Busybox is the static busybox the images are built from.
const Busybox = ocitest.Busybox

// Unavailable says why no engine can run here ("" when one can). Under
// CI=true tests must fail instead of skipping (see Require).
func Unavailable() string {
	if goruntime.GOOS != "linux" {
		return "the docker tests need Linux"
	}
	if os.Geteuid() != 0 {
		return "the docker tests start dockerd, which needs root"
	}
	for _, bin := range []string{"dockerd", "containerd", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not installed (apt-get install -y docker.io)"
		}
	}
	if _, err := os.Stat(Busybox); err != nil {
		return Busybox + " missing (apt-get install -y busybox-static)"
	}
	return ""
}

// Require skips t when no engine can run here, or fails it under CI=true.
func Require(t testing.TB) {
	t.Helper()
	if why := Unavailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no container engine: %s", why)
		}
		t.Skip("skipping: " + why)
	}
}

// Engine is a dockerd (or a Podman API service) of the test's own.
type Engine struct {
	Host string // unix:///.../docker.sock
	dir  string
	bin  string
	env  []string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	log  *testutil.SyncBuffer
}

// StartEngine starts dockerd trusting insecureRegistries (host:port) and
// waits until it answers. Close stops it and removes its directories.
func StartEngine(ctx context.Context, insecureRegistries ...string) (*Engine, error) {
	dir, err := os.MkdirTemp("", "dk") // short: unix socket paths are at most 107 bytes
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}"), 0o600); err != nil {
		return nil, err
	}
	e := &Engine{Host: "unix://" + filepath.Join(dir, "docker.sock"), dir: dir, bin: "dockerd"}
	e.args = []string{"--host", e.Host, "--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "x"),
		"--pidfile", filepath.Join(dir, "docker.pid"), "--config-file", filepath.Join(dir, "daemon.json"),
		"--iptables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none", "--storage-driver=vfs",
		"--shutdown-timeout=2", "--log-level=warn"}
	for _, r := range insecureRegistries {
		e.args = append(e.args, "--insecure-registry", r)
	}
	if err := e.start(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Engine) start(ctx context.Context) error {
	e.log = &testutil.SyncBuffer{}
	e.cmd = exec.Command(e.bin, e.args...)
	e.cmd.Env = append(os.Environ(), e.env...)
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := e.cmd.Start(); err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	e.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(e.cmd, e.done)
	sock := strings.TrimPrefix(e.Host, "unix://")
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-e.done:
			return fmt.Errorf("dockerd exited: %s", e.log.String())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		resp, err := hc.Get("http://docker/_ping")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("dockerd did not answer in 60s: %s", e.log.String())
}

// PodmanUnavailable says why no Podman API service can run here ("" when
// one can).
func PodmanUnavailable() string {
	if os.Geteuid() != 0 {
		return "the podman tests run a rootful service: need root"
	}
	for _, bin := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not installed (apt-get install -y podman runc)"
		}
	}
	return ""
}

// StartPodman starts `podman system service` on a private socket with its
// own storage (vfs), runtime runc (crun refuses hybrid cgroups) and
// cgroupfs, trusting insecureRegistries. Containers on it need nofile and
// nproc ulimits of at most 1024 here.
func StartPodman(ctx context.Context, insecureRegistries ...string) (*Engine, error) {
	dir, err := os.MkdirTemp("", "pdk")
	if err != nil {
		return nil, err
	}
	var conf strings.Builder
	for _, r := range insecureRegistries {
		fmt.Fprintf(&conf, "[[registry]]\nlocation = %q\ninsecure = true\n", r)
	}
	regConf := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(regConf, []byte(conf.String()), 0o600); err != nil {
		return nil, err
	}
	e := &Engine{Host: "unix://" + filepath.Join(dir, "podman.sock"), dir: dir, bin: "podman",
		env: []string{"CONTAINERS_REGISTRIES_CONF=" + regConf}}
	e.args = []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
		"--storage-driver", "vfs", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
		"--tmpdir", filepath.Join(dir, "tmp"), "system", "service", "--time=0", e.Host}
	if err := e.start(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Stop stops dockerd gracefully (its containers are stopped with it) and
// waits for it to exit.
func (e *Engine) Stop() {
	if e.cmd == nil || e.cmd.Process == nil {
		return
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
		<-e.done
	}
	e.cmd = nil
}

// Restart stops dockerd and starts it again over the same data (an engine
// restart: its containers stop, the containers themselves are kept).
func (e *Engine) Restart(ctx context.Context) error {
	e.Stop()
	return e.start(ctx)
}

// Log is dockerd's output so far.
func (e *Engine) Log() string {
	if e.log == nil {
		return ""
	}
	return e.log.String()
}

// Close stops dockerd and removes its directories (unmounting what it
// left mounted).
func (e *Engine) Close() {
	if e.bin == "podman" && e.cmd != nil { // conmon keeps containers past the service: remove them first
		n := len(e.args) - 4 // the global flags, without "system service --time=0 host"
		rm := exec.Command("podman", append(slices.Clone(e.args[:n]), "rm", "--all", "--force", "--time", "0")...)
		rm.Env = append(os.Environ(), e.env...)
		_ = rm.Run()
	}
	e.Stop()
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		var mounts []string
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], e.dir+"/") {
				mounts = append(mounts, f[1])
			}
		}
		for i := len(mounts) - 1; i >= 0; i-- {
			_ = syscall.Unmount(mounts[i], syscall.MNT_DETACH)
		}
	}
	_ = os.RemoveAll(e.dir)
}

// Registry is ocitest's in-memory OCI registry on 127.0.0.1.
type Registry = ocitest.Registry

// StartRegistry serves an empty registry; Close stops it.
func StartRegistry() *Registry { return ocitest.StartRegistry() }

// Image is a test image pushed to the registry.
type Image = ocitest.Image

// BuildTestServer builds testserver (ocitest.BuildTestServer).
func BuildTestServer(ctx context.Context, dir string) (string, error) {
	return ocitest.BuildTestServer(ctx, dir)
}
