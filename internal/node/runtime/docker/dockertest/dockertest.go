// Package dockertest owns what the container runtime's tests need from the
// host: a Docker Engine (Debian's docker.io dockerd) started on a private
// socket in a temporary directory with its own data and exec roots, no
// iptables, no bridge and the vfs storage driver, so it touches nothing
// of the host's; an OCI registry on loopback (go-containerregistry's
// in-memory registry) that the engine trusts as insecure; and test images
// built here from /bin/busybox (Debian's busybox-static) and a static Go
// HTTP server (testserver), pushed to that registry, so pulls use the real
// registry protocol without a network. It must not be imported outside
// tests.
package dockertest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Busybox is the static busybox the images are built from.
const Busybox = "/bin/busybox"

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
	log  *bytes.Buffer
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
	e.log = &bytes.Buffer{}
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

// Registry is an in-memory OCI registry on 127.0.0.1.
type Registry struct {
	Host string // 127.0.0.1:port
	srv  *httptest.Server
}

// StartRegistry serves an empty registry; Close stops it.
func StartRegistry() *Registry {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	u, _ := url.Parse(srv.URL)
	return &Registry{Host: u.Host, srv: srv}
}

// Close stops the registry.
func (r *Registry) Close() { r.srv.Close() }

// Image is a test image pushed to the registry.
type Image struct {
	Ref    string // 127.0.0.1:port/drover/test:tag
	Digest string // sha256:… of its manifest
}

// BuildTestServer builds testserver for the host's architecture,
// statically (CGO_ENABLED=0), into dir and returns its path.
func BuildTestServer(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "testserver")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/drover-dev/drover/internal/node/runtime/docker/dockertest/testserver")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build testserver: %w: %s", err, b)
	}
	return out, nil
}

// Push builds an image of busybox (at /bin/busybox with sh, head, tail,
// sleep, cat and ls linked to it) plus, when server is set, that binary at
// /testserver (the image's command), and pushes it as repo:tag.
func (r *Registry) Push(repo, tag, server string, env ...string) (Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		b, err := layerTar(server)
		return io.NopCloser(bytes.NewReader(b)), err
	})
	if err != nil {
		return Image{}, err
	}
	cfg := v1.Config{Cmd: []string{"/bin/sh"}, Env: append([]string{"PATH=/bin"}, env...), StopSignal: "SIGTERM"}
	if server != "" {
		cfg.Cmd = []string{"/testserver"}
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{Architecture: goruntime.GOARCH, OS: "linux", Config: cfg})
	if err != nil {
		return Image{}, err
	}
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return Image{}, err
	}
	ref, err := name.ParseReference(r.Host+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		return Image{}, err
	}
	if err := remote.Write(ref, img); err != nil {
		return Image{}, fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return Image{}, err
	}
	return Image{Ref: ref.String(), Digest: d.String()}, nil
}

// layerTar is the image's one layer.
func layerTar(server string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(hdr *tar.Header, body []byte) error {
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(
		add(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil),
		add(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, nil),
		add(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))}, bb),
	); err != nil {
		return nil, err
	}
	for _, l := range []string{"sh", "head", "tail", "sleep", "cat", "ls", "echo", "env"} {
		if err := add(&tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil); err != nil {
			return nil, err
		}
	}
	if server != "" {
		b, err := os.ReadFile(server)
		if err != nil {
			return nil, err
		}
		if err := add(&tar.Header{Name: "testserver", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(b))}, b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
