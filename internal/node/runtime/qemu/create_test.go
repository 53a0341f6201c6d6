package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
)

func TestCreateOverlay(t *testing.T) {
	qemuImg := testutil.QEMUImg(t)
	ctx := context.Background()
	dir := t.TempDir()
	raw := filepath.Join(dir, "base.raw")
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "raw", raw, "1G")

	info, err := image.Inspect(ctx, qemuImg, raw, "")
	if err != nil || info.Format != "raw" || info.VirtualSize != 1<<30 {
		t.Fatalf("Inspect(raw) = %+v, %v", info, err)
	}
	tests := []struct {
		name string
		gib  int
		want int64
	}{
		{"same size", 0, 1 << 30},
		{"grown", 2, 2 << 30},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "o"+string(rune('a'+i))+".qcow2")
			if err := CreateOverlay(ctx, qemuImg, raw, info, out, tc.gib); err != nil {
				t.Fatal(err)
			}
			got, err := exec.Command(qemuImg, "info", "--output=json", "-f", "qcow2", out).Output()
			if err != nil {
				t.Fatal(err)
			}
			// The overlay names its backing file and that file's format.
			for _, want := range []string{`"backing-filename": "` + raw + `"`, `"backing-filename-format": "raw"`} {
				if !bytes.Contains(got, []byte(want)) {
					t.Errorf("overlay info lacks %s:\n%s", want, got)
				}
			}
			ov, err := image.Inspect(ctx, qemuImg, out, "")
			if !errors.Is(err, image.ErrUnsafeImage) {
				t.Errorf("Inspect(overlay) = %+v, %v; want its backing file refused", ov, err)
			}
		})
	}
	big := filepath.Join(dir, "big.raw")
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "raw", big, "3G")
	info, _ = image.Inspect(ctx, qemuImg, big, "")
	if err := CreateOverlay(ctx, qemuImg, big, info, filepath.Join(dir, "small.qcow2"), 1); err == nil || !strings.Contains(err.Error(), "smaller") {
		t.Errorf("shrinking overlay: %v, want refused", err)
	}
	// An Info that did not come from Inspect has no format to name.
	if err := CreateOverlay(ctx, qemuImg, raw, image.Info{}, filepath.Join(dir, "unknown.qcow2"), 0); err == nil {
		t.Error("overlay over a base of unknown format created")
	}
}

// TestCreateRefusesUnsafeImages: a base image that names a host file (an
// external data file, a backing file) or has another format is refused by
// Create, as image_pull_failed naming the field, before any overlay or
// QEMU exists.
func TestCreateRefusesUnsafeImages(t *testing.T) {
	qemuImg := testutil.QEMUImg(t)
	ctx := context.Background()
	root, images := shortDir(t), t.TempDir()
	img := func(name string) string { return filepath.Join(images, name) }

	// The host file the attacker wants: a guest booting the crafted image
	// would read it as its disk.
	secret := bytes.Repeat([]byte("HOST-SECRET "), 4096)
	hostFile := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(hostFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	// Made over a decoy, then pointed at the host file (creating the image
	// over the host file would truncate it).
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-o", "data_file="+img("decoy")+",data_file_raw=on", img("datafile.qcow2"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "amend", "-f", "qcow2", "-o", "data_file="+hostFile, img("datafile.qcow2"))
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "raw", img("base.raw"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", hostFile, img("backed.qcow2"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "vdi", img("disk.vdi"), "1M")

	// The attack is real: QEMU's block layer reads the host file through
	// the crafted image (what the guest's virtio disk would show).
	leak := filepath.Join(t.TempDir(), "leak.raw")
	testutil.RunQEMUImg(t, qemuImg, "convert", "-f", "qcow2", "-O", "raw", img("datafile.qcow2"), leak)
	if b, _ := os.ReadFile(leak); !bytes.Contains(b, []byte("HOST-SECRET")) {
		t.Fatal("precondition: the data-file image does not expose the host file")
	}

	r := newTestRuntime(t, root, []string{images}, func(o *Options) { o.QEMUImg = qemuImg })
	spec := func(id, file string) runtime.Spec {
		b, err := os.ReadFile(img(file))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		return runtime.Spec{ID: id, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 64}, Owner: "test",
			Image: runtime.Image{URL: "file://" + img(file), SHA256: hex.EncodeToString(sum[:])}}
	}
	for _, tc := range []struct{ id, file, want string }{
		{"datafile", "datafile.qcow2", `spec.image: qcow2 external data-file "` + hostFile + `" refused`},
		{"backed", "backed.qcow2", `spec.image: qcow2 backing file "` + hostFile + `" refused`},
		{"vdi", "disk.vdi", `spec.image: disk format "vdi" refused`},
	} {
		t.Run(tc.id, func(t *testing.T) {
			_, err := r.Create(ctx, spec(tc.id, tc.file))
			if got := runtime.ReasonOf(err, ""); got != api.ReasonImagePullFailed || !errors.Is(err, image.ErrUnsafeImage) {
				t.Fatalf("Create: %v (reason %q), want image_pull_failed refusing the image", err, got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Create: %v, want %q", err, tc.want)
			}
			for _, p := range []string{filepath.Join(r.instDir, tc.id), filepath.Join(r.overlayDir, tc.id+".qcow2")} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("%s exists after a refused Create", p)
				}
			}
			if _, err := r.Inspect(ctx, tc.id); !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("Inspect: %v, want ErrNotFound", err)
			}
		})
	}
	// A plain raw base is fine, and its overlay names the format.
	st, err := r.Create(ctx, spec("plain", "base.raw"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(qemuImg, "info", "--output=json", st.Overlay).Output()
	if err != nil || !bytes.Contains(out, []byte(`"backing-filename-format": "raw"`)) {
		t.Errorf("overlay info: %v:\n%s", err, out)
	}
}
