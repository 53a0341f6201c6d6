// Package ocitest owns the OCI images the node's tests build: an
// in-memory OCI registry on loopback (go-containerregistry's
// pkg/registry, optionally behind a handler wrapper such as BasicAuth),
// image layers written from tar entries, and the standard test image of
// /bin/busybox (Debian's busybox-static) plus a static Go HTTP server
// (testserver), pushed with the real registry protocol and no network.
// The container runtime's tests (dockertest) and the OCI image cache's
// tests (internal/node/oci) share it. It must not be imported outside
// tests.
package ocitest

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"

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

// Registry is an in-memory OCI registry on 127.0.0.1.
type Registry struct {
	Host string // 127.0.0.1:port
	srv  *httptest.Server
}

// StartRegistry serves an empty registry, its handler passed through wrap
// in order (BasicAuth, a fault injector, ...); Close stops it. Pushes made
// through this package go to the registry's own handler, past the
// wrappers.
func StartRegistry(wrap ...func(http.Handler) http.Handler) *Registry {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var h http.Handler = reg
	for _, w := range wrap {
		h = w(h)
	}
	srv := httptest.NewServer(bypass(reg, h))
	u, _ := url.Parse(srv.URL)
	return &Registry{Host: u.Host, srv: srv}
}

// pushHeader marks this package's own pushes, which skip the wrappers.
const pushHeader = "X-Ocitest-Push"

// bypass routes requests carrying pushHeader to reg and the others to h.
func bypass(reg, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get(pushHeader) != "" {
			reg.ServeHTTP(w, req)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// Close stops the registry.
func (r *Registry) Close() { r.srv.Close() }

// BasicAuth answers 401 with a Basic challenge to requests without user
// and password.
func BasicAuth(user, password string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if u, p, ok := req.BasicAuth(); !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="ocitest"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"ocitest: authentication required"}]}`)
				return
			}
			next.ServeHTTP(w, req)
		})
	}
}

// Image is a test image pushed to the registry.
type Image struct {
	Ref    string // 127.0.0.1:port/drover/test:tag
	Digest string // sha256:… of its manifest
}

// BuildTestServer builds testserver for the host's architecture,
// statically (CGO_ENABLED=0), into dir and returns its path.
func BuildTestServer(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "testserver")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/drover-dev/drover/internal/node/ocitest/testserver")
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
	layer, err := BusyboxLayer(server)
	if err != nil {
		return Image{}, err
	}
	cfg := v1.Config{Cmd: []string{"/bin/sh"}, Env: append([]string{"PATH=/bin"}, env...), StopSignal: "SIGTERM"}
	if server != "" {
		cfg.Cmd = []string{"/testserver"}
	}
	img, err := NewImage(cfg, layer)
	if err != nil {
		return Image{}, err
	}
	return r.PushImage(repo, tag, img)
}

// NewImage is a linux image of the host's architecture with cfg and the
// layers, bottom first.
func NewImage(cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{Architecture: goruntime.GOARCH, OS: "linux", Config: cfg})
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(img, layers...)
}

// PushImage pushes img as repo:tag.
func (r *Registry) PushImage(repo, tag string, img v1.Image) (Image, error) {
	ref, err := name.ParseReference(r.Host+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		return Image{}, err
	}
	if err := remote.Write(ref, img, remote.WithTransport(pushTransport{})); err != nil {
		return Image{}, fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return Image{}, err
	}
	return Image{Ref: ref.String(), Digest: d.String()}, nil
}

// pushTransport marks this package's pushes (see StartRegistry).
type pushTransport struct{}

func (pushTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(pushHeader, "1")
	return http.DefaultTransport.RoundTrip(req)
}

// File is one tar entry of a layer: its header and, for a regular file,
// its content (Size is set from Body when 0).
type File struct {
	Hdr  tar.Header
	Body []byte
}

// LayerTar writes the entries as an uncompressed tar.
func LayerTar(files ...File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := f.Hdr
		if hdr.Typeflag == tar.TypeReg && hdr.Size == 0 {
			hdr.Size = int64(len(f.Body))
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			return nil, fmt.Errorf("tar %s: %w", hdr.Name, err)
		}
		if _, err := tw.Write(f.Body); err != nil {
			return nil, fmt.Errorf("tar %s: %w", hdr.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Layer is a gzip-compressed layer of the entries.
func Layer(files ...File) (v1.Layer, error) {
	b, err := LayerTar(files...)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
}

// BusyboxLayer is the standard test image's one layer: /bin/busybox, its
// applets sh, head, tail, sleep, cat, ls, echo and env, /tmp and, when
// server is set, that binary at /testserver.
func BusyboxLayer(server string) (v1.Layer, error) {
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return nil, err
	}
	files := []File{
		{Hdr: tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{Hdr: tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}},
		{Hdr: tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, Body: bb},
	}
	for _, l := range []string{"sh", "head", "tail", "sleep", "cat", "ls", "echo", "env"} {
		files = append(files, File{Hdr: tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}})
	}
	if server != "" {
		b, err := os.ReadFile(server)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Hdr: tar.Header{Name: "testserver", Typeflag: tar.TypeReg, Mode: 0o755}, Body: b})
	}
	return Layer(files...)
}
