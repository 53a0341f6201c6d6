//go:build linux

package oci_test

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/drover-dev/drover/internal/node/oci"
	"github.com/drover-dev/drover/internal/node/ocitest"
)

// randomImage is a one-layer image of size incompressible bytes.
func randomImage(t *testing.T, reg *ocitest.Registry, tag string, size int) ocitest.Image {
	t.Helper()
	b := make([]byte, size)
	_, _ = rand.Read(b)
	layer, err := ocitest.Layer(ocitest.File{Hdr: hdr("blob", tar.TypeReg, 0o644), Body: b})
	if err != nil {
		t.Fatal(err)
	}
	img, err := ocitest.NewImage(v1.Config{}, layer)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := reg.PushImage("drover/rand", tag, img)
	if err != nil {
		t.Fatal(err)
	}
	return pushed
}

func TestCacheEvictsLRUButNotLeased(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := ocitest.StartRegistry()
	defer reg.Close()
	a, b, c := randomImage(t, reg, "a", 64<<10), randomImage(t, reg, "b", 64<<10), randomImage(t, reg, "c", 64<<10)
	dir := t.TempDir()
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	s := newStore(t, dir, 160<<10, clk) // two of the three fit

	pull := func(img ocitest.Image) *oci.Image {
		t.Helper()
		got, err := s.Pull(ctx, img.Ref, img.Digest, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	pa := pull(a)
	if err := s.Acquire("inst-a", a.Digest); err != nil { // a is in use, and the oldest
		t.Fatal(err)
	}
	pb := pull(b)
	pull(c) // over the bound: b goes, a is leased
	u := s.Usage()
	if strings.Join(u.Images, ",") != c.Digest+","+a.Digest || u.Bytes > u.MaxBytes {
		t.Fatalf("usage %+v, want images c and a within the bound", u)
	}
	blob := func(l oci.Layer) string {
		return filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(l.Digest, "sha256:"))
	}
	if _, err := os.Stat(blob(pb.Layers[0])); err == nil {
		t.Error("b's layer is still cached")
	}
	if _, err := os.Stat(blob(pa.Layers[0])); err != nil {
		t.Errorf("leased a's layer was evicted: %v", err)
	}

	// The lease outlives a restart; released, a is the LRU and goes.
	s2 := newStore(t, dir, 160<<10, clk)
	if got := s2.Leases(); got["inst-a"] != a.Digest {
		t.Fatalf("leases after restart %v", got)
	}
	if err := s2.Acquire("inst-c", c.Digest); err != nil {
		t.Fatal(err)
	}
	if err := s2.Release("inst-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Pull(ctx, b.Ref, b.Digest, nil, nil); err != nil {
		t.Fatal(err)
	}
	if u := s2.Usage(); strings.Join(u.Images, ",") != b.Digest+","+c.Digest {
		t.Errorf("after release and pull of b: %v, want b, c (a, released, was least recently used)", u.Images)
	}
	if err := s2.Acquire("inst-x", a.Digest); !errors.Is(err, oci.ErrNotPulled) {
		t.Errorf("acquire an evicted image: %v, want ErrNotPulled", err)
	}
}

func TestParseAuth(t *testing.T) {
	for _, bad := range []string{"no-colon", `{"auths":{"x":{"auth":"!!"}}}`, `{"nothing":1}`, "{", "a:b\nc:d"} {
		if _, err := oci.ParseAuth([]byte(bad), "x"); err == nil {
			t.Errorf("ParseAuth(%q): no error", bad)
		} else if strings.Contains(err.Error(), "!!") {
			t.Errorf("ParseAuth(%q): error shows the secret: %v", bad, err)
		}
	}
	docker := `{"auths":{"https://index.docker.io/v1/":{"username":"u","password":"p"}}}`
	a, err := oci.ParseAuth([]byte(docker), "index.docker.io")
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := a.Authorization(); err != nil || cfg.Username != "u" || cfg.Password != "p" {
		t.Errorf("docker hub entry: %+v, %v", cfg, err)
	}
}
