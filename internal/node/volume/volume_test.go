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

	if err := m2.Check(ctx, again); err != nil {
		t.Fatalf("check: %v", err)
	}
	// Size 0 and format "" take the existing volume as it is.
	if v0, err := m2.Ensure(ctx, "pgdata", 0, ""); err != nil || v0.SizeGiB != 1 || v0.Format != FormatRaw {
		t.Fatalf("ensure 0/\"\": %+v %v", v0, err)
	}

	// Held volumes are not deleted.
	if err := m2.Attach("pgdata", "db-1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Delete(ctx, "pgdata", nil); !errors.Is(err, ErrInUse) || !isVolErr(err) || !strings.Contains(err.Error(), "db-1") {
		t.Fatalf("delete while attached: %v", err)
	}
	if list, _ := m2.List(); len(list) != 1 || list[0].Holders[0] != "db-1" {
		t.Fatalf("list %+v", list)
	}
	// Reconcile drops a holder that no longer exists.
	if err := m2.Reconcile(nil); err != nil {
		t.Fatal(err)
	}
	if existed, err := m2.Delete(ctx, "pgdata", nil); err != nil || !existed {
		t.Fatal(existed, err)
	}
	if _, err := os.Stat(v.Path); !os.IsNotExist(err) {
		t.Fatalf("file left: %v", err)
	}
	if list, _ := m2.List(); len(list) != 0 {
		t.Fatalf("list after delete %+v", list)
	}
	if existed, err := m2.Delete(ctx, "pgdata", nil); err != nil || existed {
		t.Fatalf("second delete: %v %v", existed, err)
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
	if err := m.Check(context.Background(), v); err != nil {
		t.Fatalf("check: %v", err)
	}
	// Format "" takes the existing qcow2 volume; raw asks for a conversion.
	if v2, err := m.Ensure(context.Background(), "cache", 0, ""); err != nil || v2.Format != FormatQCOW2 {
		t.Fatalf("ensure existing qcow2: %+v %v", v2, err)
	}
	if _, err := m.Ensure(context.Background(), "cache", 0, FormatRaw); !isVolErr(err) {
		t.Fatalf("raw over qcow2: %v", err)
	}
}

// TestAttachOneHolder: a volume holds one live instance at a time; a
// holder that is not live (its instance is gone) is dropped by Attach and
// Delete instead of blocking the volume.
func TestAttachOneHolder(t *testing.T) {
	needTools(t, "mkfs.ext4")
	ctx := context.Background()
	m, err := New(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Ensure(ctx, "data", 1, ""); err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{"a": true, "b": true}
	isLive := func(id string) bool { return live[id] }
	if err := m.Attach("data", "a", isLive); err != nil {
		t.Fatal(err)
	}
	if err := m.Attach("data", "a", isLive); err != nil {
		t.Fatalf("attach again: %v", err)
	}
	err = m.Attach("data", "b", isLive)
	if !errors.Is(err, ErrInUse) || !isVolErr(err) || !strings.Contains(err.Error(), "held by instance a") {
		t.Fatalf("second holder: %v", err)
	}
	if _, err := m.Delete(ctx, "data", isLive); !errors.Is(err, ErrInUse) {
		t.Fatalf("delete while a is live: %v", err)
	}
	live["a"] = false // a crashed agent never detached it
	if err := m.Attach("data", "b", isLive); err != nil {
		t.Fatalf("attach over a stale holder: %v", err)
	}
	if v, _, _ := m.Get("data"); len(v.Holders) != 1 || v.Holders[0] != "b" {
		t.Fatalf("holders %v", v.Holders)
	}
	live["b"] = false
	if existed, err := m.Delete(ctx, "data", isLive); err != nil || !existed {
		t.Fatalf("delete with a stale holder: %v %v", existed, err)
	}
}

// TestCheck: a volume file that holds no ext4 filesystem, or a qcow2 image
// naming a backing file, is refused before QEMU sees it.
func TestCheck(t *testing.T) {
	needTools(t, "mkfs.ext4", "qemu-img")
	ctx := context.Background()
	m, err := New(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := m.Ensure(ctx, "raw", 1, FormatRaw)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(raw.Path, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.Check(ctx, raw); !isVolErr(err) || !strings.Contains(err.Error(), "no ext4 filesystem") {
		t.Fatalf("zeroed raw volume: %v", err)
	}
	q, err := m.Ensure(ctx, "q", 1, FormatQCOW2)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", raw.Path, q.Path).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	if err := m.Check(ctx, q); !isVolErr(err) || !strings.Contains(err.Error(), "backing file") {
		t.Fatalf("qcow2 with a backing file: %v", err)
	}
	if err := os.Remove(q.Path); err != nil {
		t.Fatal(err)
	}
	if err := m.Check(ctx, q); !isVolErr(err) {
		t.Fatalf("missing file: %v", err)
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
		if _, err := m.Delete(ctx, bad, nil); !isVolErr(err) {
			t.Fatalf("delete %q: %v", bad, err)
		}
	}
	if _, err := m.Ensure(ctx, "ok", -1, FormatRaw); !isVolErr(err) {
		t.Fatalf("size -1: %v", err)
	}
	if _, err := m.Ensure(ctx, "ok", MaxSizeGiB+1, FormatRaw); !isVolErr(err) {
		t.Fatalf("size over the maximum: %v", err)
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
	if err := m.Attach("ok", "x", nil); !isVolErr(err) {
		t.Fatalf("attach of a missing volume: %v", err)
	}
	if err := m.Detach("ok", "x"); err != nil {
		t.Fatalf("detach of a missing volume: %v", err)
	}
}
