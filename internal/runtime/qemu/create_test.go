package qemu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCreateOverlay(t *testing.T) {
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("qemu-img not found (required when CI=true)")
		}
		t.Skip("qemu-img not found on PATH")
	}
	ctx := context.Background()
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(qemuImg, args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v: %s", args, err, out)
		}
	}
	raw := filepath.Join(dir, "base.raw")
	run("create", "-q", "-f", "raw", raw, "1G")
	chained := filepath.Join(dir, "chained.qcow2")
	run("create", "-q", "-f", "qcow2", "-F", "raw", "-b", raw, chained)

	info, err := QEMUImageInfo(ctx, qemuImg, raw)
	if err != nil || info.Format != "raw" || info.VirtualSize != 1<<30 {
		t.Fatalf("info(raw) = %+v, %v", info, err)
	}
	tests := []struct {
		name    string
		base    string
		gib     int
		wantErr string
		want    int64
	}{
		{"same size", raw, 0, "", 1 << 30},
		{"grown", raw, 2, "", 2 << 30},
		{"backing chain refused", chained, 0, "has a backing file", 0},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			info, err := QEMUImageInfo(ctx, qemuImg, tc.base)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "o"+string(rune('a'+i))+".qcow2")
			err = CreateOverlay(ctx, qemuImg, tc.base, info, out, tc.gib)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("CreateOverlay: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := QEMUImageInfo(ctx, qemuImg, out)
			if err != nil || got.Format != "qcow2" || got.VirtualSize != tc.want || got.BackingFilename != tc.base {
				t.Errorf("overlay = %+v, %v; want qcow2 of %d over %s", got, err, tc.want, tc.base)
			}
		})
	}
	big := filepath.Join(dir, "big.raw")
	run("create", "-q", "-f", "raw", big, "3G")
	info, _ = QEMUImageInfo(ctx, qemuImg, big)
	if err := CreateOverlay(ctx, qemuImg, big, info, filepath.Join(dir, "small.qcow2"), 1); err == nil || !strings.Contains(err.Error(), "smaller") {
		t.Errorf("shrinking overlay: %v, want refused", err)
	}
}
