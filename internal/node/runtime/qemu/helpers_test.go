package qemu

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/drover-dev/drover/internal/node/image"
)

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testLog logs through t when -v is set.
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
// limited to 107 bytes; t.TempDir() paths carry the test name).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "dq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// newTestRuntime builds a Runtime over root whose image cache accepts
// local files under allowed.
func newTestRuntime(t testing.TB, root string, allowed []string, mods ...func(*Options)) *Runtime {
	t.Helper()
	cache, err := image.NewCache(image.Options{Dir: filepath.Join(root, "images"), AllowedDirs: allowed, Log: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Root: root, Images: cache, Accel: "tcg", Log: testLog(t)}
	for _, m := range mods {
		m(&opts)
	}
	r, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
