package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
)

func TestInspect(t *testing.T) {
	qemuImg := testutil.QEMUImg(t)
	dir := t.TempDir()
	ctx := context.Background()
	path := func(name string) string { return filepath.Join(dir, name) }

	hostFile := path("host-secret")
	if err := os.WriteFile(hostFile, []byte("root:x:0:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "raw", path("plain.raw"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", path("plain.qcow2"), "2M")
	// Made over a decoy, then pointed at the host file, as an attacker
	// would (creating it over the host file would truncate that).
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-o", "data_file="+path("decoy")+",data_file_raw=on", path("datafile.qcow2"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "amend", "-f", "qcow2", "-o", "data_file="+hostFile, path("datafile.qcow2"))
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", path("plain.raw"), path("backed.qcow2"))
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", path("backed.qcow2"), path("chain.qcow2"))
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "vdi", path("disk.vdi"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "vmdk", path("disk.vmdk"), "1M")
	// A backing file that qemu-img would block on if it opened it, and one
	// that does not exist: the header alone must refuse both.
	fifo := path("fifo")
	mkfifo(t, fifo)
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", path("plain.raw"), path("fifo-backed.qcow2"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "rebase", "-q", "-u", "-f", "qcow2", "-F", "raw", "-b", fifo, path("fifo-backed.qcow2"))
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", path("plain.raw"), path("gone-backed.qcow2"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "rebase", "-q", "-u", "-f", "qcow2", "-F", "raw", "-b", path("missing.raw"), path("gone-backed.qcow2"))

	tests := []struct {
		name, file, format string
		want               Info
		field, value       string // refused field
	}{
		{"raw probed", "plain.raw", "", Info{Format: FormatRaw, VirtualSize: 1 << 20}, "", ""},
		{"raw given", "plain.raw", FormatRaw, Info{Format: FormatRaw, VirtualSize: 1 << 20}, "", ""},
		{"qcow2 probed", "plain.qcow2", "", Info{Format: FormatQCOW2, VirtualSize: 2 << 20}, "", ""},
		{"qcow2 given", "plain.qcow2", FormatQCOW2, Info{Format: FormatQCOW2, VirtualSize: 2 << 20}, "", ""},
		// Given as raw, a qcow2 file is just bytes: nothing it names is opened.
		{"qcow2 bytes as raw", "datafile.qcow2", FormatRaw, Info{Format: FormatRaw}, "", ""},
		{"external data file", "datafile.qcow2", "", Info{}, "data-file", hostFile},
		{"external data file given qcow2", "datafile.qcow2", FormatQCOW2, Info{}, "data-file", hostFile},
		{"backing file", "backed.qcow2", "", Info{}, "backing-filename", path("plain.raw")},
		{"backing chain", "chain.qcow2", FormatQCOW2, Info{}, "backing-filename", path("backed.qcow2")},
		{"backing fifo", "fifo-backed.qcow2", "", Info{}, "backing-filename", fifo},
		{"backing missing", "gone-backed.qcow2", "", Info{}, "backing-filename", path("missing.raw")},
		{"vdi", "disk.vdi", "", Info{}, "format", "vdi"},
		{"vmdk", "disk.vmdk", "", Info{}, "format", "vmdk"},
		{"vmdk asked for", "disk.vmdk", "vmdk", Info{}, "format", "vmdk"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			got, err := Inspect(ctx, qemuImg, path(tc.file), tc.format)
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got.Format != tc.want.Format || (tc.want.VirtualSize != 0 && got.VirtualSize != tc.want.VirtualSize) {
					t.Errorf("Inspect = %+v, want %+v", got, tc.want)
				}
				return
			}
			var ue *UnsafeImageError
			if !errors.As(err, &ue) || !errors.Is(err, ErrUnsafeImage) {
				t.Fatalf("Inspect = %+v, %v; want an *UnsafeImageError", got, err)
			}
			if ue.Field != tc.field || ue.Value != tc.value || !strings.Contains(err.Error(), tc.value) {
				t.Errorf("refused %s %q (%v), want %s %q", ue.Field, ue.Value, err, tc.field, tc.value)
			}
		})
	}
	if got := (&UnsafeImageError{Format: "qcow2", Field: "data-file", Value: "/etc/shadow"}).Error(); got != `qcow2 external data-file "/etc/shadow" refused` {
		t.Errorf("message %q", got)
	}
	if _, err := Inspect(ctx, qemuImg, "plain.raw", ""); err == nil {
		t.Error("relative path accepted")
	}
	if _, err := Inspect(ctx, qemuImg, path("absent.qcow2"), ""); err == nil || errors.Is(err, ErrUnsafeImage) {
		t.Errorf("missing file: %v, want a qemu-img error", err)
	}
}

func TestCheckInfo(t *testing.T) {
	for _, tc := range []struct{ name, json, field string }{
		{"full backing only", `{"format":"qcow2","full-backing-filename":"/x"}`, "backing-filename"},
		{"backing format only", `{"format":"qcow2","backing-filename-format":"raw"}`, "backing-filename"},
		{"qed", `{"format":"qed"}`, "format"},
		{"ok", `{"format":"raw","virtual-size":5}`, ""},
	} {
		info, err := checkInfo("/img", []byte(tc.json))
		var ue *UnsafeImageError
		switch {
		case tc.field == "" && (err != nil || info.VirtualSize != 5):
			t.Errorf("%s: %+v, %v", tc.name, info, err)
		case tc.field != "" && (!errors.As(err, &ue) || ue.Field != tc.field):
			t.Errorf("%s: %v, want %s refused", tc.name, err, tc.field)
		}
	}
	if _, err := checkInfo("/img", []byte(`{}`)); err == nil {
		t.Error("no format accepted")
	}
	if _, err := checkInfo("/img", []byte(`not json`)); err == nil {
		t.Error("garbage accepted")
	}
}
