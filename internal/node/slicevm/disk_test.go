package slicevm

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestProvisionRefusesUnsafeImage: a qcow2 base image whose header names
// an external data file (a host file) would make qemu-img convert copy
// that host file onto the slot's NVMe. The image write refuses it as
// CodeImageUnsafe naming the image param, and the NVMe is untouched.
func TestProvisionRefusesUnsafeImage(t *testing.T) {
	e := newEnv(t, envOpts{qcow2: true})
	qemuImg := needQEMUImg(t)
	images := filepath.Dir(e.imgPath)

	// The host file the attacker wants on the NVMe.
	hostFile := filepath.Join(t.TempDir(), "host-secret")
	writeFile(t, hostFile, bytes.Repeat([]byte("HOST-SECRET "), 4096))
	// Made over a decoy, then pointed at the host file (creating it over
	// the host file would truncate it).
	attack := filepath.Join(images, "datafile.qcow2")
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(images, "decoy")+",data_file_raw=on", attack, "1M")
	testutil.RunQEMUImg(t, qemuImg, "amend", "-f", "qcow2", "-o", "data_file="+hostFile, attack)
	backed := filepath.Join(images, "backed.qcow2")
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", hostFile, backed, "1M")

	// The attack is real: what the old image write ran copies the host
	// file through the crafted image.
	leak := filepath.Join(t.TempDir(), "leak.raw")
	writeFile(t, leak, make([]byte, 1<<20))
	testutil.RunQEMUImg(t, qemuImg, "convert", "-n", "-f", "qcow2", "-O", "raw", attack, leak)
	if b, _ := os.ReadFile(leak); !bytes.Contains(b, []byte("HOST-SECRET")) {
		t.Fatal("precondition: the data-file image does not expose the host file")
	}

	before, err := os.ReadFile(e.nvmeFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, img, field, want string
		url                    bool
	}{
		{"data-file by path", attack, "params.image_path", `qcow2 external data-file "` + hostFile + `" refused`, false},
		{"data-file by url", attack, "params.image_url", `qcow2 external data-file "` + hostFile + `" refused`, true},
		{"backing file", backed, "params.image_path", `qcow2 backing file "` + hostFile + `" refused`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := e.slotParams()
			params.ImageSHA256 = fileSHA(t, tc.img)
			params.ImagePath = tc.img
			if tc.url {
				params.ImagePath, params.ImageURL = "", (&url.URL{Scheme: "file", Path: tc.img}).String()
			}
			out, _, err := e.p.Provision(context.Background(), params, nil)
			fe := asError(t, err)
			if fe.Code != CodeImageUnsafe || fe.Phase != PhaseImageWriteConvert || out.FailedPhase != PhaseImageWriteConvert ||
				!errors.Is(err, image.ErrUnsafeImage) {
				t.Fatalf("err = %+v, want %s in %s", fe, CodeImageUnsafe, PhaseImageWriteConvert)
			}
			if len(fe.Fields) != 1 || fe.Fields[0].Field != tc.field || !strings.Contains(fe.Fields[0].Message, tc.want) ||
				!strings.HasPrefix(fe.Message, tc.field+": ") {
				t.Errorf("fields = %+v, message %q; want %s: %s", fe.Fields, fe.Message, tc.field, tc.want)
			}
			after, err := os.ReadFile(e.nvmeFile)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(after, before) || bytes.Contains(after, []byte("HOST-SECRET")) {
				t.Error("the NVMe was written")
			}
			if _, err := e.rt.Inspect(context.Background(), "vm-1"); err == nil {
				t.Error("a VM was created from the refused image")
			}
			assertGone(t, e, "vm-1", "slot-0")
		})
	}
}

// TestWriteImage: accepted qcow2 and raw images are written onto the
// device with their inspected format named; a device smaller than the
// image is a blocker.
func TestWriteImage(t *testing.T) {
	e := newEnv(t, envOpts{qcow2: true})
	qemuImg := needQEMUImg(t)
	raw := filepath.Join(filepath.Dir(e.imgPath), "base.raw")
	ctx := context.Background()
	for _, tc := range []struct{ img, format string }{{e.imgPath, "qcow2"}, {raw, "raw"}} {
		t.Run(tc.format, func(t *testing.T) {
			dev := filepath.Join(t.TempDir(), "nvme")
			writeFile(t, dev, bytes.Repeat([]byte{0xab}, nvmeBytes))
			st, err := e.p.writeImage(ctx, qemuImg, "params.image_path", tc.img, dev)
			if err != nil {
				t.Fatal(err)
			}
			if want := "qemu-img convert -n -f " + tc.format + " -O raw"; !strings.Contains(st.detail, want) {
				t.Errorf("detail = %q, want %q", st.detail, want)
			}
			nv, err := os.ReadFile(dev)
			if err != nil || len(nv) != nvmeBytes || !bytes.Equal(nv[:imgBytes], e.rawImage) || nv[nvmeBytes-1] != 0xab {
				t.Errorf("device: %d bytes, image written %v, err %v", len(nv), bytes.Equal(nv[:imgBytes], e.rawImage), err)
			}
		})
	}
	small := filepath.Join(t.TempDir(), "small")
	writeFile(t, small, make([]byte, imgBytes/2))
	_, err := e.p.writeImage(ctx, qemuImg, "params.image_path", raw, small)
	if fe := asError(t, err); fe.Code != CodeImageWriteFailed || fe.Blocker != "nvme_too_small:"+small {
		t.Errorf("small device: %+v", fe)
	}
}

// TestImageField pins imageField to the params' JSON names.
func TestImageField(t *testing.T) {
	if f := imageField(task.VMProvisionParams{ImagePath: "/x"}); f != "params.image_path" {
		t.Errorf("path: %s", f)
	}
	if f := imageField(task.VMProvisionParams{ImageURL: "https://x"}); f != "params.image_url" {
		t.Errorf("url: %s", f)
	}
}
