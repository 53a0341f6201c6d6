//go:build linux

package oci_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/oci"
	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// requireTools skips (or under CI=true fails) without root, e2fsprogs
// and qemu-img: building a root filesystem keeps ownership with lchown.
func requireTools(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "building root filesystems keeps ownership: needs root"
	}
	for _, bin := range []string{"mkfs.ext4", "debugfs", "e2fsck", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil && why == "" {
			why = bin + " not installed (apt-get install -y e2fsprogs qemu-utils)"
		}
	}
	if why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: " + why)
		}
		t.Skip("skipping: " + why)
	}
}

// clock is a test clock that moves a second per reading.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

func newStore(t *testing.T, dir string, maxBytes int64, clk *clock) *oci.Store {
	t.Helper()
	if clk == nil {
		clk = &clock{t: time.Unix(1_700_000_000, 0)}
	}
	s, err := oci.New(oci.Options{Dir: dir, MaxBytes: maxBytes, AllowLocalURLs: true, Now: clk.now,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var mtime = time.Unix(1_600_000_000, 0)

func hdr(name string, typ byte, mode int64, extra ...func(*tar.Header)) tar.Header {
	h := tar.Header{Name: name, Typeflag: typ, Mode: mode, ModTime: mtime, Format: tar.FormatPAX}
	for _, f := range extra {
		f(&h)
	}
	return h
}

func owner(uid, gid int) func(*tar.Header) { return func(h *tar.Header) { h.Uid, h.Gid = uid, gid } }

func link(target string) func(*tar.Header) { return func(h *tar.Header) { h.Linkname = target } }

// pushApp pushes the two-layer image the rootfs checks read.
func pushApp(t *testing.T, reg *ocitest.Registry, repo, tag string) ocitest.Image {
	t.Helper()
	lower, err := ocitest.Layer(
		ocitest.File{Hdr: hdr("etc/", tar.TypeDir, 0o755)},
		ocitest.File{Hdr: hdr("etc/hostname", tar.TypeReg, 0o644), Body: []byte("app\n")},
		ocitest.File{Hdr: hdr("etc/secret", tar.TypeReg, 0o640, owner(1000, 1000)), Body: []byte("s3cret\n")},
		ocitest.File{Hdr: hdr("bin/", tar.TypeDir, 0o755)},
		ocitest.File{Hdr: hdr("bin/tool", tar.TypeReg, 0o755), Body: []byte("#!/bin/sh\necho tool\n")},
		ocitest.File{Hdr: hdr("bin/link", tar.TypeSymlink, 0o777, link("tool"))},
		ocitest.File{Hdr: hdr("bin/hard", tar.TypeLink, 0o755, link("bin/tool"))},
		ocitest.File{Hdr: hdr("bin/suid", tar.TypeReg, 0o4755), Body: []byte("x")},
		ocitest.File{Hdr: hdr("data/", tar.TypeDir, 0o750, owner(1000, 1000))},
		ocitest.File{Hdr: hdr("data/gone", tar.TypeReg, 0o644), Body: []byte("deleted above\n")},
		ocitest.File{Hdr: hdr("data/kept", tar.TypeReg, 0o644), Body: []byte("kept\n")},
		ocitest.File{Hdr: hdr("opq/", tar.TypeDir, 0o755)},
		ocitest.File{Hdr: hdr("opq/lower", tar.TypeReg, 0o644), Body: []byte("hidden by the opaque dir\n")},
		ocitest.File{Hdr: hdr("opq/sub/", tar.TypeDir, 0o755)},
		ocitest.File{Hdr: hdr("srv/", tar.TypeDir, 0o1777)},
		// A symlink pointing out of the tree: entries below it stay inside.
		ocitest.File{Hdr: hdr("esc", tar.TypeSymlink, 0o777, link("../../../../tmp"))},
	)
	if err != nil {
		t.Fatal(err)
	}
	upper, err := ocitest.Layer(
		ocitest.File{Hdr: hdr("data/.wh.gone", tar.TypeReg, 0o644)},
		ocitest.File{Hdr: hdr("opq/upper", tar.TypeReg, 0o600, owner(33, 33)), Body: []byte("upper\n")},
		ocitest.File{Hdr: hdr("opq/.wh..wh..opq", tar.TypeReg, 0o644)},
		ocitest.File{Hdr: hdr("esc/inside", tar.TypeReg, 0o644), Body: []byte("stays in the tree\n")},
		ocitest.File{Hdr: hdr("etc/hostname", tar.TypeReg, 0o644), Body: []byte("app2\n")},
	)
	if err != nil {
		t.Fatal(err)
	}
	// A zstd layer (OCI's other compression) on top.
	zb, err := ocitest.LayerTar(ocitest.File{Hdr: hdr("etc/zstd", tar.TypeReg, 0o600, owner(7, 8)), Body: []byte("zstd\n")})
	if err != nil {
		t.Fatal(err)
	}
	top, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(zb)), nil },
		tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	img, err := ocitest.NewImage(v1.Config{Entrypoint: []string{"/bin/tool"}, Cmd: []string{"serve"},
		Env: []string{"PATH=/bin", "MODE=test"}, User: "1000:1000", WorkingDir: "/srv",
		ExposedPorts: map[string]struct{}{"8080/tcp": {}}}, lower, upper, top)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := reg.PushImage(repo, tag, img)
	if err != nil {
		t.Fatal(err)
	}
	return pushed
}

// debugfs runs one debugfs request against an ext4 image.
func debugfs(t *testing.T, img, req string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", req, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs -R %q: %v: %s", req, err, out)
	}
	return string(out)
}

type inode struct {
	typ             string
	mode, uid, gid  int
	links           int
	mtime           int64
	fastLink, found bool
}

var (
	reType  = regexp.MustCompile(`Type: (\S+)\s+Mode:\s+(\d+)`)
	reOwner = regexp.MustCompile(`User:\s+(\d+)\s+Group:\s+(\d+)`)
	reLinks = regexp.MustCompile(`Links: (\d+)`)
	reMtime = regexp.MustCompile(`mtime: 0x([0-9a-f]+)`)
)

func stat(t *testing.T, img, p string) inode {
	t.Helper()
	out := debugfs(t, img, "stat "+p)
	m := reType.FindStringSubmatch(out)
	if m == nil {
		return inode{}
	}
	mode, _ := strconv.ParseInt(m[2], 8, 64)
	in := inode{typ: m[1], mode: int(mode), found: true}
	if o := reOwner.FindStringSubmatch(out); o != nil {
		in.uid, _ = strconv.Atoi(o[1])
		in.gid, _ = strconv.Atoi(o[2])
	}
	if l := reLinks.FindStringSubmatch(out); l != nil {
		in.links, _ = strconv.Atoi(l[1])
	}
	if mt := reMtime.FindStringSubmatch(out); mt != nil {
		in.mtime, _ = strconv.ParseInt(mt[1], 16, 64)
	}
	in.fastLink = strings.Contains(out, `Fast link dest: "tool"`)
	return in
}

// names lists a directory of the image.
func names(t *testing.T, img, dir string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(debugfs(t, img, "ls -p "+dir), "\n") {
		f := strings.Split(line, "/")
		if len(f) > 5 && f[5] != "." && f[5] != ".." {
			out = append(out, f[5])
		}
	}
	return out
}

func TestPullAndRootfs(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := ocitest.StartRegistry()
	defer reg.Close()
	app := pushApp(t, reg, "drover/app", "v1")
	dir := t.TempDir()
	s := newStore(t, dir, 0, nil)

	var mu sync.Mutex
	done := map[string]int{}
	progress := func(p oci.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if p.Done {
			done[p.Phase]++
		}
	}
	img, err := s.Pull(ctx, app.Ref, "", nil, progress)
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != app.Digest || len(img.Layers) != 3 || img.Cached || img.Layers[2].MediaType != string(types.OCILayerZStd) {
		t.Fatalf("pulled %+v, want digest %s, 3 layers (the last zstd), downloaded", img, app.Digest)
	}
	want := oci.ImageConfig{Entrypoint: []string{"/bin/tool"}, Cmd: []string{"serve"}, Env: []string{"PATH=/bin", "MODE=test"},
		User: "1000:1000", WorkingDir: "/srv", ExposedPorts: []string{"8080/tcp"}}
	if got, _ := json.Marshal(img.Config); string(got) != string(must(json.Marshal(want))) {
		t.Errorf("config %s, want %s", got, must(json.Marshal(want)))
	}
	for _, l := range img.Layers {
		if _, err := os.Stat(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(l.Digest, "sha256:"))); err != nil {
			t.Errorf("layer blob: %v", err)
		}
	}

	rfs, err := s.Rootfs(ctx, img.Digest, progress)
	if err != nil {
		t.Fatal(err)
	}
	if rfs.Cached || rfs.Path != filepath.Join(dir, "rootfs", strings.TrimPrefix(img.Digest, "sha256:")+".ext4") {
		t.Fatalf("rootfs %+v", rfs)
	}
	if done[oci.PhasePull] != 3 || done[oci.PhaseExtract] != 3 || done[oci.PhaseRootfs] != 1 {
		t.Errorf("progress done per phase %v, want pull 3, extract 3, rootfs 1", done)
	}
	if out, err := exec.Command("e2fsck", "-fn", rfs.Path).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn: %v: %s", err, out)
	}
	var cfg oci.ImageConfig
	if b, err := os.ReadFile(rfs.ConfigPath); err != nil || json.Unmarshal(b, &cfg) != nil || cfg.WorkingDir != "/srv" {
		t.Errorf("config beside the rootfs: %s %v", b, err)
	}

	for _, c := range []struct {
		path           string
		typ            string
		mode, uid, gid int
	}{
		{"/etc/hostname", "regular", 0o644, 0, 0},
		{"/etc/secret", "regular", 0o640, 1000, 1000},
		{"/bin/tool", "regular", 0o755, 0, 0},
		{"/bin/suid", "regular", 0o4755, 0, 0},
		{"/bin/link", "symlink", 0o777, 0, 0},
		{"/data", "directory", 0o750, 1000, 1000},
		{"/opq/upper", "regular", 0o600, 33, 33},
		{"/srv", "directory", 0o1777, 0, 0},
		{"/tmp/inside", "regular", 0o644, 0, 0},
		{"/etc/zstd", "regular", 0o600, 7, 8},
	} {
		in := stat(t, rfs.Path, c.path)
		if !in.found || in.typ != c.typ || in.mode != c.mode || in.uid != c.uid || in.gid != c.gid {
			t.Errorf("%s: %+v, want %s %o %d:%d", c.path, in, c.typ, c.mode, c.uid, c.gid)
		}
		if in.mtime != mtime.Unix() {
			t.Errorf("%s: mtime %d, want %d", c.path, in.mtime, mtime.Unix())
		}
	}
	if in := stat(t, rfs.Path, "/bin/link"); !in.fastLink {
		t.Errorf("/bin/link does not point at tool: %+v", in)
	}
	if tool, hard := stat(t, rfs.Path, "/bin/tool"), stat(t, rfs.Path, "/bin/hard"); tool.links != 2 || hard.links != 2 {
		t.Errorf("hard link: tool has %d links, hard %d; want 2", tool.links, hard.links)
	}
	if got := strings.Join(names(t, rfs.Path, "/data"), ","); got != "kept" {
		t.Errorf("/data holds %q, want only kept (gone whited out)", got)
	}
	if got := strings.Join(names(t, rfs.Path, "/opq"), ","); got != "upper" {
		t.Errorf("/opq holds %q, want only upper (opaque)", got)
	}
	if got := debugfs(t, rfs.Path, "cat /etc/hostname"); !strings.Contains(got, "app2") {
		t.Errorf("/etc/hostname: %q, want the upper layer's", got)
	}
	if in := stat(t, rfs.Path, "/"); in.uid != 0 || in.mode != 0o755 {
		t.Errorf("root dir: %+v", in)
	}
	if _, err := os.Stat("/tmp/inside"); err == nil {
		t.Error("a layer wrote /tmp/inside on the host through a symlink")
	}

	// Cached: the rootfs, and a digest-pinned pull without the registry.
	again, err := s.Rootfs(ctx, img.Digest, nil)
	if err != nil || !again.Cached || again.Path != rfs.Path {
		t.Fatalf("second Rootfs: %+v, %v", again, err)
	}
	reg.Close()
	cached, err := s.Pull(ctx, app.Ref, app.Digest, nil, nil)
	if err != nil || !cached.Cached || cached.Digest != app.Digest {
		t.Fatalf("pinned pull with the registry gone: %+v, %v", cached, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(entries) != 0 {
		t.Errorf("tmp holds %d leftovers", len(entries))
	}

	t.Run("overlay", func(t *testing.T) {
		inst := t.TempDir()
		ov, err := oci.Overlay(ctx, "", rfs.Path, inst)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("qemu-img", "info", "--output=json", "-U", ov).CombinedOutput()
		if err != nil {
			t.Fatalf("qemu-img info: %v: %s", err, out)
		}
		var info struct {
			Format            string `json:"format"`
			Backing           string `json:"backing-filename"`
			BackingFormat     string `json:"backing-filename-format"`
			VirtualSize       int64  `json:"virtual-size"`
			FullBackingFormat string `json:"full-backing-filename"`
		}
		if err := json.Unmarshal(out, &info); err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(rfs.Path)
		if info.Format != "qcow2" || info.Backing != rfs.Path || info.BackingFormat != "raw" || info.VirtualSize != fi.Size() {
			t.Errorf("overlay info %+v, want qcow2 backed by raw %s of %d bytes", info, rfs.Path, fi.Size())
		}

		cp := filepath.Join(inst, "rootfs.ext4")
		if _, err := oci.CopyForFirecracker(ctx, rfs.Path, cp); err != nil {
			t.Fatal(err)
		}
		if in := stat(t, cp, "/etc/secret"); in.uid != 1000 || in.mode != 0o640 {
			t.Errorf("copy: /etc/secret %+v", in)
		}
		if cfi, _ := os.Stat(cp); cfi.Size() != fi.Size() || cfi.Mode().Perm() != 0o600 {
			t.Errorf("copy: size %d mode %v, want %d 0600", cfi.Size(), cfi.Mode(), fi.Size())
		}
	})
}

// repoOf drops a reference's tag.
func repoOf(ref string) string { return ref[:strings.LastIndex(ref, ":")] }

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// wantReason checks err is a *runtime.Error with reason and a message
// holding each of parts.
func wantReason(t *testing.T, err error, reason api.ReasonCode, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %s", reason)
	}
	var re *runtime.Error
	if !errors.As(err, &re) || re.Reason != reason {
		t.Fatalf("error %v (%T), want a runtime.Error with reason %s", err, err, reason)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not say %q", err, p)
		}
	}
}

func TestPullFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	denied := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/drover/denied/") {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusForbidden)
				_, _ = io.WriteString(w, `{"errors":[{"code":"DENIED","message":"pulls of drover/denied are suspended"}]}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	reg := ocitest.StartRegistry(denied)
	defer reg.Close()
	app := pushApp(t, reg, "drover/app", "v1")
	other := randomImage(t, reg, "other", 1024)
	if _, err := reg.Push("drover/denied", "v1", ""); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, t.TempDir(), 0, nil)

	_, err := s.Pull(ctx, app.Ref, "sha256:"+strings.Repeat("ab", 32), nil, nil)
	wantReason(t, err, api.ReasonImagePullFailed, "digest mismatch", app.Digest)
	if !errors.Is(err, oci.ErrDigestMismatch) {
		t.Errorf("%v is not ErrDigestMismatch", err)
	}
	_, err = s.Pull(ctx, repoOf(app.Ref)+"@"+app.Digest, other.Digest, nil, nil)
	wantReason(t, err, api.ReasonImagePullFailed, "digest mismatch")
	if img, err := s.Pull(ctx, app.Ref, app.Digest, nil, nil); err != nil || img.Digest != app.Digest {
		t.Fatalf("pull pinned to the right digest: %+v, %v", img, err)
	}
	byDigest := repoOf(other.Ref) + "@" + other.Digest
	if img, err := s.Pull(ctx, byDigest, "", nil, nil); err != nil || img.Digest != other.Digest {
		t.Fatalf("pull by digest: %+v, %v", img, err)
	}

	_, err = s.Pull(ctx, reg.Host+"/drover/denied:v1", "", nil, nil)
	wantReason(t, err, api.ReasonImagePullFailed, "DENIED", "pulls of drover/denied are suspended")
	_, err = s.Pull(ctx, reg.Host+"/drover/app:nope", "", nil, nil)
	wantReason(t, err, api.ReasonImagePullFailed, "MANIFEST_UNKNOWN")

	strict, err := oci.New(oci.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = strict.Pull(ctx, app.Ref, "", nil, nil)
	wantReason(t, err, api.ReasonImagePullFailed, "127.0.0.1")
	if !errors.Is(err, image.ErrLocalURL) {
		t.Errorf("%v is not image.ErrLocalURL", err)
	}
}

func TestPullAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := ocitest.StartRegistry(ocitest.BasicAuth("drover", "hunter2"))
	defer reg.Close()
	app := pushApp(t, reg, "drover/private", "v1")

	s := newStore(t, t.TempDir(), 0, nil)
	_, err := s.Pull(ctx, app.Ref, "", nil, nil)
	wantReason(t, err, api.ReasonImagePullFailed, "UNAUTHORIZED", "ocitest: authentication required")
	_, err = s.Pull(ctx, app.Ref, "", []byte("drover:wrong"), nil)
	wantReason(t, err, api.ReasonImagePullFailed, "authentication required")
	if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error shows the password: %v", err)
	}
	_, err = s.Pull(ctx, app.Ref, "", []byte(`{"auths":{"other.example":{"auth":"eDp5"}}}`), nil)
	wantReason(t, err, api.ReasonImagePullFailed, "no entry for "+reg.Host, "other.example")

	cfg := fmt.Sprintf(`{"auths":{"http://%s/v2/":{"auth":%q}}}`, reg.Host, base64.StdEncoding.EncodeToString([]byte("drover:hunter2")))
	for name, secret := range map[string]string{
		"user:password": "drover:hunter2\n",
		"config.json":   cfg,
		"registry_auth": `{"username":"drover","password":"hunter2"}`,
	} {
		s := newStore(t, t.TempDir(), 0, nil)
		if img, err := s.Pull(ctx, app.Ref, app.Digest, []byte(secret), nil); err != nil || img.Digest != app.Digest {
			t.Errorf("%s: %+v, %v", name, img, err)
		}
	}
}

func TestRootfsRefusesTraversal(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := ocitest.StartRegistry()
	defer reg.Close()
	for _, c := range []struct{ name, path string }{
		{"dotdot", "../../etc/x"},
		{"hardlink", "bin/h"},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := []ocitest.File{{Hdr: hdr("bin/", tar.TypeDir, 0o755)}}
			if c.name == "hardlink" {
				files = append(files, ocitest.File{Hdr: hdr("bin/h", tar.TypeLink, 0o644, link("../../etc/passwd"))})
			} else {
				files = append(files, ocitest.File{Hdr: hdr(c.path, tar.TypeReg, 0o644), Body: []byte("x")})
			}
			layer, err := ocitest.Layer(files...)
			if err != nil {
				t.Fatal(err)
			}
			ld, _ := layer.Digest()
			img, err := ocitest.NewImage(v1.Config{}, layer)
			if err != nil {
				t.Fatal(err)
			}
			pushed, err := reg.PushImage("drover/evil", c.name, img)
			if err != nil {
				t.Fatal(err)
			}
			s := newStore(t, t.TempDir(), 0, nil)
			if _, err := s.Pull(ctx, pushed.Ref, "", nil, nil); err != nil {
				t.Fatal(err)
			}
			_, err = s.Rootfs(ctx, pushed.Digest, nil)
			wantReason(t, err, api.ReasonRootfsBuildFailed, ld.String(), c.path)
			var be *oci.BuildError
			if !errors.As(err, &be) || be.Layer != ld.String() || be.Path != c.path || !errors.Is(err, oci.ErrUnsafePath) {
				t.Errorf("error %v: want a BuildError of layer %s path %s, ErrUnsafePath", err, ld, c.path)
			}
			if _, err := os.Stat("/etc/x"); err == nil {
				t.Error("/etc/x written on the host")
			}
		})
	}
}

func TestPrepareLeases(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := ocitest.StartRegistry()
	defer reg.Close()
	app := pushApp(t, reg, "drover/app", "v1")
	s := newStore(t, t.TempDir(), 1, nil) // a bound nothing fits: only the lease keeps the image
	img, rfs, err := s.Prepare(ctx, "inst-1", app.Ref, app.Digest, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Leases()["inst-1"] != img.Digest {
		t.Errorf("leases %v", s.Leases())
	}
	if _, err := s.Prune(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rfs.Path); err != nil {
		t.Fatalf("leased rootfs evicted: %v", err)
	}
	if err := s.Release("inst-1"); err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Prune(); err != nil || len(ev) != 1 || ev[0] != img.Digest {
		t.Fatalf("prune after release: %v, %v", ev, err)
	}
	if _, err := os.Stat(rfs.Path); err == nil {
		t.Error("released rootfs kept past the bound")
	}
}
