package qemu

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
)

// TestFactory: the registry's factory refuses to build without an
// accelerator and otherwise passes the agent's options through.
func TestFactory(t *testing.T) {
	root := shortDir(t)
	cache, err := image.NewCache(image.Options{Dir: filepath.Join(root, "images"), Log: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	opts := runtime.Options{Root: root, Images: cache, QEMUBinary: "/opt/qemu/qemu-system-x86_64",
		Log: discardLog(), OnOrphanRemoved: func(string) {}}
	if _, err := Factory(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "no working accelerator") {
		t.Fatalf("Factory without an accelerator = %v, want a no working accelerator error", err)
	}
	opts.Accel = "tcg"
	rt, err := Factory(context.Background(), opts)
	if err != nil {
		t.Fatalf("Factory: %v", err)
	}
	r, ok := rt.(*Runtime)
	if !ok {
		t.Fatalf("Factory built a %T, want *qemu.Runtime", rt)
	}
	defer r.Close()
	if r.Name() != Name || r.opts.Root != root || r.opts.Accel != "tcg" || r.opts.QEMUBinary != opts.QEMUBinary ||
		r.opts.Images != cache || r.opts.OnOrphanRemoved == nil {
		t.Errorf("options not passed through: %+v", r.opts)
	}
}
