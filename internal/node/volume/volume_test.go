package volume

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s: %v", tool, err)
			}
			t.Skipf("%s not installed: %v", tool, err)
		}
	}
}

func isVolErr(err error) bool {
	var re *runtime.Error
	return errors.As(err, &re) && re.Reason == api.ReasonVolumeAttachFailed
}

func TestRawLifecycle(t *testing.T) {
	needTools(t, "mkfs.ext4", "e2fsck", "dumpe2fs")
	ctx := context.Background()
	m, err := New(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.Ensure(ctx, "pgdata", 1, "")
	if err != nil {
		t.Fatal(err)
	}
	if v.Format != FormatRaw || !strings.HasSuffix(v.Path, "/pgdata.ext4") {
		t.Fatalf("volume %+v", v)
	}
	fi, err := os.Stat(v.Path)
	if err != nil || fi.Size() != 1<<30 {
		t.Fatalf("size: %v %v", fi, err)
	}
	if out, err := exec.Command("e2fsck", "-fn", v.Path).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck: %v: %s", err, out)
	}
	if out, _ := exec.Command("dumpe2fs", "-h", v.Path).CombinedOutput(); !strings.Contains(string(out), "pgdata") {
		t.Fatalf("label missing: %s", out)
	}
	// Data survives: a second Ensure (a restart, a recreation) reuses the file.
	f, err := os.OpenFile(v.Path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("KEEP-ME"), 1<<30-4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	m2, _ := New(Options{Dir: m.opts.Dir}) // an agent restart
	again, err := m2.Ensure(ctx, "pgdata", 1, FormatRaw)
	if err != nil || again.Path != v.Path {
		t.Fatalf("reuse: %+v %v", again, err)
	}
	b, _ := os.ReadFile(v.Path)
	if string(b[1<<30-4096:1<<30-4096+7]) != "KEEP-ME" {
		t.Fatal("Ensure rewrote an existing volume")
	}
	if _, err := m2.Ensure(ctx, "pgdata", 2, FormatRaw); !isVolErr(err) {
		t.Fatalf("grow: %v", err)
	}
	if _, err := m2.Ensure(ctx, "pgdata", 1, FormatQCOW2); !isVolErr(err) {
		t.Fatalf("format change: %v", err)
	}

	// Held volumes are not deleted.
	if err := m2.Attach("pgdata", "db-1"); err != nil {
		t.Fatal(err)
	}
	if err := m2.Delete(ctx, "pgdata"); !errors.Is(err, ErrInUse) || !isVolErr(err) {
		t.Fatalf("delete while attached: %v", err)
	}
	if list, _ := m2.List(); len(list) != 1 || list[0].Holders[0] != "db-1" {
		t.Fatalf("list %+v", list)
	}
	// Reconcile drops a holder that no longer exists.
	if err := m2.Reconcile(nil); err != nil {
		t.Fatal(err)
	}
	if err := m2.Delete(ctx, "pgdata"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v.Path); !os.IsNotExist(err) {
		t.Fatalf("file left: %v", err)
	}
	if list, _ := m2.List(); len(list) != 0 {
		t.Fatalf("list after delete %+v", list)
	}
	if err := m2.Delete(ctx, "pgdata"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

func TestQCOW2(t *testing.T) {
	needTools(t, "mkfs.ext4", "qemu-img")
	m, err := New(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.Ensure(context.Background(), "cache", 2, FormatQCOW2)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", v.Path).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil || info.Format != "qcow2" || info.VirtualSize != 2<<30 {
		t.Fatalf("qemu-img info: %+v %v", info, err)
	}
	if fi, _ := os.Stat(v.Path); fi.Size() > 64<<20 {
		t.Fatalf("qcow2 not sparse: %d bytes", fi.Size())
	}
}

func TestNamesAndErrors(t *testing.T) {
	m, err := New(Options{Dir: t.TempDir(), MkfsExt4: "/nonexistent/mkfs.ext4"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, bad := range []string{"", "../etc", "a/b", ".hidden", "UPPER", "a..b", strings.Repeat("x", 64)} {
		if _, err := m.Ensure(ctx, bad, 1, FormatRaw); !isVolErr(err) {
			t.Fatalf("name %q: %v", bad, err)
		}
		if err := m.Delete(ctx, bad); !isVolErr(err) {
			t.Fatalf("delete %q: %v", bad, err)
		}
	}
	if _, err := m.Ensure(ctx, "ok", 0, FormatRaw); !isVolErr(err) {
		t.Fatalf("size 0: %v", err)
	}
	if _, err := m.Ensure(ctx, "ok", 1, "vmdk"); !isVolErr(err) {
		t.Fatalf("format: %v", err)
	}
	// A failing mkfs leaves nothing behind.
	if _, err := m.Ensure(ctx, "ok", 1, FormatRaw); !isVolErr(err) || !strings.Contains(err.Error(), "mkfs") {
		t.Fatalf("failing mkfs: %v", err)
	}
	if ents, _ := os.ReadDir(m.opts.Dir); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
	if err := m.Attach("ok", "x"); !isVolErr(err) {
		t.Fatalf("attach of a missing volume: %v", err)
	}
	if err := m.Detach("ok", "x"); err != nil {
		t.Fatalf("detach of a missing volume: %v", err)
	}
}
