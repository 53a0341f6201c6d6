package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/node/slicevm"
)

// TestOpenSliceDHCPPrunesGoneVMs: at agent start the reservations of
// slice VMs the runtime no longer has (a crash mid-provision or
// mid-release) are dropped; a live slice VM's are kept; a file named
// after an instance that is not a slice VM is dropped too.
func TestOpenSliceDHCPPrunesGoneVMs(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	dir := filepath.Join(root, "slices", "dhcp-hosts.d")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"vm-live":   "52:54:00:00:00:01,10.77.0.10,vm-live\n",
		"vm-gone":   "52:54:00:00:00:02,10.77.0.11,vm-gone\n",
		"web-other": "52:54:00:00:00:03,10.77.0.12,web-other\n",
	}
	for vm, s := range files {
		if err := os.WriteFile(filepath.Join(dir, vm+".conf"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rt := mock.New(mock.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for id, owner := range map[string]string{"vm-live": slicevm.Owner, "web-other": "reconcile"} {
		if _, err := rt.Create(ctx, runtime.Spec{ID: id, Owner: owner}); err != nil {
			t.Fatal(err)
		}
	}
	a := &Agent{cfg: Config{SliceCIDR: "10.77.0.0/24"}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	st, err := a.openSliceDHCP(ctx, rt, root)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.VMs(); !slices.Equal(got, []string{"vm-live"}) {
		t.Fatalf("reservations kept for %v, want [vm-live]", got)
	}
}
