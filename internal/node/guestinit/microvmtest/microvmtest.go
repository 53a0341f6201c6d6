// Package microvmtest builds what tests of the microVM runtime boot: the
// test kernel (qemutest finds it, or skips), an initramfs of drover-init
// built now with `go build` plus that kernel's modules, and small ext4
// root filesystems of busybox and the test HTTP server. Only tests may
// import it.
package microvmtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
)

// Kit is a microVM kernel and its drover-init initramfs.
type Kit struct {
	Kernel, Initrd string
	Modules        []string // the modules the initramfs holds
	QEMU, QEMUImg  string
}

// Build writes the initramfs into dir (t.TempDir() when ""); it skips t
// (fails it when CI=true) when the kernel or QEMU is missing.
func Build(t testing.TB, dir string) Kit {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	qdir := filepath.Join(dir, "qemutest")
	if err := os.MkdirAll(qdir, 0o755); err != nil {
		t.Fatal(err)
	}
	g := qemutest.Build(t, qdir)
	init := filepath.Join(dir, "drover-init")
	cmd := exec.Command("go", "build", "-o", init, "github.com/drover-dev/drover/cmd/drover-init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build drover-init: %v: %s", err, out)
	}
	bin, err := os.ReadFile(init)
	if err != nil {
		t.Fatal(err)
	}
	modDir := filepath.Join(filepath.Dir(filepath.Dir(g.Kernel)), "lib", "modules", g.KernelVersion)
	k := Kit{Kernel: g.Kernel, Initrd: filepath.Join(dir, "initrd.img"), QEMU: g.QEMU, QEMUImg: g.QEMUImg}
	f, err := os.Create(k.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	if k.Modules, err = guestinit.BuildInitramfs(f, bin, modDir); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return k
}

// Rootfs writes dir/rootfs.ext4: busybox (/bin/sh and friends) and the
// test HTTP server at /testserver (PORT from its environment).
func Rootfs(t testing.TB, dir string) string {
	t.Helper()
	tree := filepath.Join(dir, "tree")
	for _, d := range []string{"bin", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no /bin/busybox: %v", err)
	}
	if err := os.WriteFile(filepath.Join(tree, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "cat", "head", "sleep", "echo", "ls", "id", "hostname"} {
		if err := os.Symlink("busybox", filepath.Join(tree, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ocitest.BuildTestServer(context.Background(), tree); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "rootfs.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", tree, img, "64M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return img
}
