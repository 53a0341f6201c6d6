package firecracker

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// testEnv is a state root, a fake firecracker binary and the files a spec
// names (a "kernel" and an "ext4 rootfs": bytes, never booted).
type testEnv struct {
	root, bin, reqLog string
	files             string
	rootfs, kernel    api.Artifact
}

// newTestEnv writes the fake binary: a script that re-executes this test
// binary as the fake with extra environment (KEY=value pairs).
func newTestEnv(t *testing.T, extra ...string) *testEnv {
	t.Helper()
	e := &testEnv{root: shortDir(t), files: t.TempDir()}
	e.reqLog = filepath.Join(e.files, "requests.jsonl")
	e.bin = writeFakeBinary(t, e, extra...)
	e.rootfs = e.artifact(t, "rootfs.ext4", strings.Repeat("ext4", 4096))
	e.kernel = e.artifact(t, "vmlinux", "\x7fELF fake kernel")
	return e
}

// writeFakeBinary writes a script that re-executes this test binary as the
// contract server with extra environment (KEY=value pairs); each call
// writes a new one.
func writeFakeBinary(t *testing.T, e *testEnv, extra ...string) string {
	t.Helper()
	specAbs, err := filepath.Abs(specPath)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{fakeEnv + "=1", fakeSpecEnv + "=" + specAbs, fakeLogEnv + "=" + e.reqLog}
	env = append(env, extra...)
	var b strings.Builder
	b.WriteString("#!/bin/sh\nexec env")
	for _, kv := range append(env, self) {
		fmt.Fprintf(&b, " '%s'", kv)
	}
	b.WriteString(" \"$@\"\n")
	d, err := os.MkdirTemp(e.files, "bin")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(d, "firecracker")
	if err := os.WriteFile(bin, []byte(b.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func (e *testEnv) artifact(t *testing.T, name, content string) api.Artifact {
	t.Helper()
	p := filepath.Join(e.files, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(content))
	return api.Artifact{URL: "file://" + p, SHA256: hex.EncodeToString(sum[:])}
}

// runtime builds a Runtime over the env's root with the fake binary.
func (e *testEnv) runtime(t *testing.T, mods ...func(*Options)) *Runtime {
	t.Helper()
	cache, err := image.NewCache(image.Options{Dir: filepath.Join(e.root, "images"), AllowedDirs: []string{e.files}, Log: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Root: e.root, Images: cache, Binary: e.bin, Log: testLog(t)}
	for _, m := range mods {
		m(&o)
	}
	r, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever a test left running dies with it.
		for k, pids := range scanProcs(r.instDir) {
			for _, pid := range pids {
				_ = killProcess(pid, k)
			}
		}
	})
	return r
}

// spec is a spec the fake accepts: the env's rootfs and kernel, ready at
// the fake's boot line.
func (e *testEnv) spec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Image: runtime.Image{URL: e.rootfs.URL, SHA256: e.rootfs.SHA256},
		Resources: runtime.Resources{VCPUs: 2, MemoryMiB: 256},
		Readiness: runtime.Readiness{Readiness: api.Readiness{SerialMarker: fakeBootedMsg}},
		VM:        &runtime.VMSpec{Boot: &api.DirectBoot{Kernel: e.kernel, Cmdline: "console=ttyS0 reboot=k panic=1"}}}
}

// requests reads what the fake processes recorded; any request the spec
// does not allow fails the test.
func (e *testEnv) requests(t *testing.T) []record {
	t.Helper()
	f, err := os.Open(e.reqLog)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("request log: %v", err)
		}
		if r.Violation != "" {
			t.Errorf("the adapter sent a request the spec does not allow: %s", r.Violation)
		}
		out = append(out, r)
	}
	return out
}

// fakeTaps is a TapProvider that hands out a name (no device is made: the
// fake opens none).
type fakeTaps struct{ released []string }

func (f *fakeTaps) Tap(_ context.Context, id string, _ runtime.VMNetwork) (Tap, error) {
	return Tap{Dev: "fctap0"}, nil
}

func (f *fakeTaps) Release(_ context.Context, id, dev string) error {
	f.released = append(f.released, id+"/"+dev)
	return nil
}

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testLog(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return discardLog()
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

// shortDir is a fresh directory with a short path (unix socket paths are
// limited to 107 bytes).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "dfc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}
