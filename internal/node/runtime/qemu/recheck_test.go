package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestStartRechecksBaseImage: an instance whose base image names a host
// file (made before Create inspected bases: simulated by swapping the
// cached base blob, or the overlay, after a good Create) is refused by
// Start as image_pull_failed naming spec.image, and QEMU never runs.
func TestStartRechecksBaseImage(t *testing.T) {
	qemuImg := testutil.QEMUImg(t)
	ctx := context.Background()
	root, images, work := shortDir(t), t.TempDir(), t.TempDir()
	img := func(name string) string { return filepath.Join(images, name) }

	hostFile := filepath.Join(work, "host-secret")
	if err := os.WriteFile(hostFile, bytes.Repeat([]byte("HOST-SECRET "), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "raw", img("base.raw"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "convert", "-f", "raw", "-O", "qcow2", img("base.raw"), img("base.qcow2"))
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-o", "data_file="+img("decoy")+",data_file_raw=on", img("datafile.qcow2"), "1M")
	testutil.RunQEMUImg(t, qemuImg, "amend", "-f", "qcow2", "-o", "data_file="+hostFile, img("datafile.qcow2"))
	testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "vdi", img("disk.vdi"), "1M")

	// The QEMU binary only records that it ran, then fails: a Start that
	// gets past the check is vm_start_failed, and the marker says QEMU ran.
	marker := filepath.Join(work, "qemu-ran")
	fakeQEMU := filepath.Join(work, "qemu")
	if err := os.WriteFile(fakeQEMU, []byte("#!/bin/sh\ntouch '"+marker+"'\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := newTestRuntime(t, root, []string{images}, func(o *Options) { o.QEMUImg, o.QEMUBinary = qemuImg, fakeQEMU })
	// create makes instance id over base and returns it and its cached
	// base blob.
	create := func(t *testing.T, id, base string) (runtime.Status, string) {
		t.Helper()
		b, err := os.ReadFile(img(base))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		digest := hex.EncodeToString(sum[:])
		st, err := r.Create(ctx, runtime.Spec{ID: id, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 64}, Owner: "test",
			Image: runtime.Image{URL: "file://" + img(base), SHA256: digest}})
		if err != nil {
			t.Fatal(err)
		}
		blob, ok := r.opts.Images.Lookup(digest)
		if !ok {
			t.Fatal("base blob not cached")
		}
		return st, blob
	}
	// replace puts src's bytes at dst (a new file: the cache's blob may be
	// read-only).
	replace := func(t *testing.T, src, dst string) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		tmp := dst + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, dst); err != nil {
			t.Fatal(err)
		}
	}
	start := func(t *testing.T, id string) error {
		t.Helper()
		_ = os.Remove(marker)
		_, err := r.Start(ctx, id)
		return err
	}

	// Good bases pass the check: QEMU is launched (and fails).
	for _, base := range []string{"base.raw", "base.qcow2"} {
		st, _ := create(t, "good-"+strings.TrimPrefix(base, "base."), base)
		if err := start(t, st.ID); runtime.ReasonOf(err, "") != api.ReasonVMStartFailed {
			t.Fatalf("Start over %s: %v, want vm_start_failed from the fake QEMU", base, err)
		} else if _, serr := os.Stat(marker); serr != nil {
			t.Fatalf("QEMU did not run over %s: %v", base, err)
		}
	}

	for _, tc := range []struct {
		name, base, want string
		swap             func(t *testing.T, st runtime.Status, blob string)
	}{
		// A pre-fix instance made from the attack image: its overlay
		// names a qcow2 base, which now has an external data file.
		{"data-file blob", "base.qcow2", `spec.image: qcow2 external data-file "` + hostFile + `" refused`,
			func(t *testing.T, st runtime.Status, blob string) {
				replace(t, img("datafile.qcow2"), blob)
				// The attack is real: the overlay now shows the host file.
				leak := filepath.Join(t.TempDir(), "leak.raw")
				testutil.RunQEMUImg(t, qemuImg, "convert", "-f", "qcow2", "-O", "raw", st.Overlay, leak)
				if b, _ := os.ReadFile(leak); !bytes.Contains(b, []byte("HOST-SECRET")) {
					t.Fatal("precondition: the overlay does not expose the host file")
				}
			}},
		// What Create made of a vdi base before it inspected bases: an
		// overlay naming the vdi format.
		{"vdi overlay", "base.raw", `spec.image: disk format "vdi" refused`, func(t *testing.T, st runtime.Status, blob string) {
			replace(t, img("disk.vdi"), blob)
			if err := os.Remove(st.Overlay); err != nil {
				t.Fatal(err)
			}
			testutil.RunQEMUImg(t, qemuImg, "create", "-q", "-f", "qcow2", "-F", "vdi", "-b", blob, st.Overlay)
		}},
		{"blob gone", "base.raw", "spec.image: ", func(t *testing.T, _ runtime.Status, blob string) {
			if err := os.Remove(blob); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, blob := create(t, strings.ReplaceAll(tc.name, " ", "-"), tc.base)
			saved := filepath.Join(t.TempDir(), "blob")
			replace(t, blob, saved)
			t.Cleanup(func() { replace(t, saved, blob) })
			tc.swap(t, st, blob)
			err := start(t, st.ID)
			if got := runtime.ReasonOf(err, ""); got != api.ReasonImagePullFailed || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start: %v (reason %q), want image_pull_failed with %q", err, got, tc.want)
			}
			if tc.name != "blob gone" && !errors.Is(err, image.ErrUnsafeImage) {
				t.Errorf("Start: %v, want ErrUnsafeImage", err)
			}
			if _, serr := os.Stat(marker); serr == nil {
				t.Error("QEMU ran over a refused base")
			}
			if got, _ := r.Inspect(ctx, st.ID); got.State != runtime.StateCreated || got.PID != 0 {
				t.Errorf("after a refused Start: %+v", got)
			}
		})
	}

	// An overlay naming a raw base reads the blob as raw, whatever its
	// bytes say: the data-file header is inert there, so Start goes on.
	t.Run("raw overlay over data-file bytes", func(t *testing.T) {
		st, blob := create(t, "raw-inert", "base.raw")
		saved := filepath.Join(t.TempDir(), "blob")
		replace(t, blob, saved)
		t.Cleanup(func() { replace(t, saved, blob) })
		replace(t, img("datafile.qcow2"), blob)
		leak := filepath.Join(work, "inert.raw")
		testutil.RunQEMUImg(t, qemuImg, "convert", "-f", "qcow2", "-O", "raw", st.Overlay, leak)
		if b, _ := os.ReadFile(leak); bytes.Contains(b, []byte("HOST-SECRET")) {
			t.Fatal("the raw-declared base exposes the host file")
		}
		if err := start(t, st.ID); runtime.ReasonOf(err, "") != api.ReasonVMStartFailed {
			t.Fatalf("Start: %v, want vm_start_failed from the fake QEMU", err)
		}
	})
}
