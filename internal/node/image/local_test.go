package image

import (
	"context"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// localTree makes an allowed dir (reached through a symlink, as
// /var/lib -> /data setups do) and a dir outside it, with files and
// symlinks in both.
type localTree struct {
	allowed, allowedLink, outside string
	content                       []byte
}

func newLocalTree(t *testing.T) localTree {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("symlinks need privileges on windows")
	}
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lt := localTree{
		allowed:     filepath.Join(base, "images"),
		allowedLink: filepath.Join(base, "images-link"),
		outside:     filepath.Join(base, "private"),
		content:     []byte("a base disk"),
	}
	for _, d := range []string{lt.allowed, filepath.Join(lt.allowed, "sub"), lt.outside} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string) {
		if err := os.WriteFile(p, lt.content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(lt.allowed, "sub", "disk.img"))
	write(filepath.Join(lt.outside, "secret.img"))
	link := func(target, name string) {
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	link(lt.allowed, lt.allowedLink)
	link(filepath.Join(lt.outside, "secret.img"), filepath.Join(lt.allowed, "escape.img"))
	link(lt.outside, filepath.Join(lt.allowed, "escape-dir"))
	link(filepath.Join(lt.allowed, "sub", "disk.img"), filepath.Join(lt.allowed, "inner.img"))
	link(filepath.Join(lt.allowed, "sub", "disk.img"), filepath.Join(lt.outside, "into-allowed.img"))
	return lt
}

func fileURL(p string) string { return (&url.URL{Scheme: "file", Path: filepath.ToSlash(p)}).String() }

func TestFetchLocal(t *testing.T) {
	lt := newLocalTree(t)
	good := digestOf(lt.content)
	wrong := strings.Repeat("0", 64)
	tests := []struct {
		name    string
		allowed []string
		src     string
		digest  string
		stage   string // empty: success
		wantIs  error
		wantErr string // exact message when set
	}{
		{name: "file url inside", src: fileURL(filepath.Join(lt.allowed, "sub", "disk.img")), digest: good},
		{name: "absolute path inside", src: filepath.Join(lt.allowed, "sub", "disk.img"), digest: good},
		{name: "file url with localhost", src: "file://localhost" + filepath.ToSlash(filepath.Join(lt.allowed, "sub", "disk.img")), digest: good},
		{name: "symlink staying inside", src: filepath.Join(lt.allowed, "inner.img"), digest: good},
		{name: "symlink from outside into allowed", src: filepath.Join(lt.outside, "into-allowed.img"), digest: good},
		{name: "allowed dir given as a symlink", allowed: []string{lt.allowedLink}, src: filepath.Join(lt.allowed, "sub", "disk.img"), digest: good},
		{name: "path through allowed symlink", src: filepath.Join(lt.allowedLink, "sub", "disk.img"), digest: good},
		{name: "outside", src: fileURL(filepath.Join(lt.outside, "secret.img")), digest: good, stage: StagePath, wantIs: ErrPathNotAllowed},
		{name: "dotdot escape", src: filepath.Join(lt.allowed, "..", "private", "secret.img"), digest: good, stage: StagePath, wantIs: ErrPathNotAllowed},
		{name: "symlink escaping", src: fileURL(filepath.Join(lt.allowed, "escape.img")), digest: good, stage: StagePath, wantIs: ErrPathNotAllowed},
		{name: "dir symlink escaping", src: filepath.Join(lt.allowed, "escape-dir", "secret.img"), digest: good, stage: StagePath, wantIs: ErrPathNotAllowed},
		{name: "no allowed dirs", allowed: []string{}, src: filepath.Join(lt.allowed, "sub", "disk.img"), digest: good, stage: StagePath, wantIs: ErrPathNotAllowed},
		{name: "missing file", src: filepath.Join(lt.allowed, "nope.img"), digest: good, stage: StagePath, wantIs: fs.ErrNotExist},
		{name: "directory", src: filepath.Join(lt.allowed, "sub"), digest: good, stage: StagePath},
		{name: "wrong digest", src: fileURL(filepath.Join(lt.allowed, "sub", "disk.img")), digest: wrong, stage: StageDigest, wantIs: ErrDigestMismatch,
			wantErr: "image: digest mismatch for " + fileURL(filepath.Join(lt.allowed, "sub", "disk.img")) + ": got " + good + ", want " + wrong},
		{name: "remote file host", src: "file://fileserver/images/disk.img", digest: good, stage: StageURL},
		{name: "relative path", src: "images/disk.img", digest: good, stage: StageURL},
		{name: "empty source", src: "", digest: good, stage: StageURL},
		{name: "unsupported scheme", src: "ftp://example.com/disk.img", digest: good, stage: StageURL,
			wantErr: `image: url ftp://example.com/disk.img: unsupported scheme "ftp" (want http, https or file)`},
		{name: "credentials redacted", src: "s3://user:pw@bucket/disk.img", digest: good, stage: StageURL,
			wantErr: `image: url s3://user:xxxxx@bucket/disk.img: unsupported scheme "s3" (want http, https or file)`},
		{name: "http without host", src: "http:///disk.img", digest: good, stage: StageURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allowed := []string{lt.allowed}
			if tt.allowed != nil {
				allowed = tt.allowed
			}
			c := newTestCache(t, Options{AllowedDirs: allowed})
			res, err := c.Fetch(t.Context(), tt.src, tt.digest)
			assertNoPartials(t, c)
			if tt.stage == "" {
				if err != nil {
					t.Fatalf("Fetch() = %v", err)
				}
				if res.SHA256 != good || res.Bytes != int64(len(lt.content)) || res.Cached {
					t.Errorf("Fetch() = %+v", res)
				}
				return
			}
			var fe *FetchError
			if !errors.As(err, &fe) || fe.Stage != tt.stage {
				t.Fatalf("Fetch() = %v, want *FetchError stage %q", err, tt.stage)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("Fetch() = %v, want errors.Is %v", err, tt.wantIs)
			}
			if tt.wantErr != "" && err.Error() != tt.wantErr {
				t.Errorf("error = %q\nwant    %q", err, tt.wantErr)
			}
			if _, ok := c.Lookup(tt.digest); ok {
				t.Error("a failed fetch left a blob in the cache")
			}
		})
	}
}

func TestCheckLocalPath(t *testing.T) {
	lt := newLocalTree(t)
	c := newTestCache(t, Options{AllowedDirs: []string{lt.allowedLink, filepath.Join(lt.outside, "not-yet")}})
	disk := filepath.Join(lt.allowed, "sub", "disk.img")
	tests := []struct {
		path string
		want string // empty: error
	}{
		{disk, disk},
		{filepath.Join(lt.allowedLink, "sub", "disk.img"), disk},
		{filepath.Join(lt.allowed, "inner.img"), disk},
		{lt.allowed, lt.allowed},
		{filepath.Join(lt.allowed, "escape.img"), ""},
		{filepath.Join(lt.outside, "secret.img"), ""},
		{"relative/disk.img", ""},
	}
	for _, tt := range tests {
		got, err := c.CheckLocalPath(tt.path)
		if tt.want == "" {
			var fe *FetchError
			if err == nil || !errors.As(err, &fe) || fe.Stage != StagePath {
				t.Errorf("CheckLocalPath(%s) = %q, %v; want a path-stage *FetchError", tt.path, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("CheckLocalPath(%s) = %q, %v; want %q", tt.path, got, err, tt.want)
		}
	}
	// A configured dir created after NewCache counts from then on.
	late := filepath.Join(lt.outside, "not-yet")
	if err := os.MkdirAll(late, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CheckLocalPath(late); err != nil {
		t.Errorf("allowed dir created later: %v", err)
	}
}

func TestVerify(t *testing.T) {
	lt := newLocalTree(t)
	c := newTestCache(t, Options{AllowedDirs: []string{lt.allowed}})
	good := digestOf(lt.content)
	fetched, err := c.Fetch(t.Context(), filepath.Join(lt.allowed, "sub", "disk.img"), good)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Verify(t.Context(), strings.ToUpper(good))
	if err != nil {
		t.Fatalf("Verify() = %v", err)
	}
	if res.Path != fetched.Path || res.Bytes != int64(len(lt.content)) || !res.Cached {
		t.Errorf("Verify() = %+v", res)
	}

	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := c.Verify(canceled, good); !errors.Is(err, context.Canceled) {
		t.Errorf("Verify(canceled) = %v, want context.Canceled", err)
	}

	// Corrupt the blob: Verify reports it and removes it.
	if err := os.Chmod(fetched.Path, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fetched.Path, []byte("a base disX"), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err = c.Verify(t.Context(), good)
	var fe *FetchError
	if !errors.As(err, &fe) || fe.Stage != StageDigest || !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Verify(corrupted) = %v, want digest mismatch", err)
	}
	if want := "image: digest mismatch for " + fetched.Path + ": got " + digestOf([]byte("a base disX")) + ", want " + good; err.Error() != want {
		t.Errorf("error = %q\nwant    %q", err, want)
	}
	if _, ok := c.Lookup(good); ok {
		t.Error("corrupted blob still in the cache")
	}
	if _, err := c.Verify(t.Context(), good); !errors.Is(err, ErrNotCached) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Verify(missing) = %v, want ErrNotCached", err)
	}
	if _, err := c.Verify(t.Context(), "xyz"); !errors.Is(err, ErrBadDigest) {
		t.Errorf("Verify(bad digest) = %v, want ErrBadDigest", err)
	}
	// The next Fetch stores it again.
	if res, err := c.Fetch(t.Context(), filepath.Join(lt.allowed, "sub", "disk.img"), good); err != nil || res.Cached {
		t.Errorf("re-fetch after corruption = %+v, %v", res, err)
	}
}

func TestNewCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c")
	if _, err := NewCache(Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "sha256"), filepath.Join(dir, "tmp")} {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() {
			t.Fatalf("%s: %v", d, err)
		}
		if runtime.GOOS != "windows" && fi.Mode().Perm() != 0o750 {
			t.Errorf("%s mode %v, want 0750", d, fi.Mode().Perm())
		}
	}
	for _, tt := range []struct {
		name string
		opts Options
		want string
	}{
		{"no dir", Options{}, "image: options: dir is required"},
		{"relative allowed dir", Options{Dir: dir, AllowedDirs: []string{"images"}}, `image: options: allowed_dirs[0] "images" is not absolute`},
		{"negative max", Options{Dir: dir, MaxBytes: -1}, "image: options: max_bytes -1 is negative"},
	} {
		if _, err := NewCache(tt.opts); err == nil || err.Error() != tt.want {
			t.Errorf("%s: NewCache() = %v, want %q", tt.name, err, tt.want)
		}
	}
	if _, ok := (&Cache{}).Lookup("not-a-digest"); ok {
		t.Error("Lookup accepted a malformed digest")
	}
}
