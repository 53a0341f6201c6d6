package guestinit

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Modules are the kernel modules, in load order, that a distribution
// kernel (Debian's builds them as modules) needs for a microVM:
// virtio-mmio and virtio-pci transports, virtio block and net, ext4, and the ACPI power
// button with evdev (the init's graceful stop). Paths are relative to
// lib/modules/<version>/kernel; a missing one is skipped (built in).
var Modules = []string{
	"drivers/virtio/virtio.ko",
	"drivers/virtio/virtio_ring.ko",
	"drivers/virtio/virtio_mmio.ko",
	"drivers/virtio/virtio_pci_modern_dev.ko",
	"drivers/virtio/virtio_pci_legacy_dev.ko",
	"drivers/virtio/virtio_pci.ko",
	"drivers/block/virtio_blk.ko",
	"net/core/failover.ko",
	"drivers/net/net_failover.ko",
	"drivers/net/virtio_net.ko",
	"lib/crc16.ko",
	"crypto/crc32c_generic.ko",
	"lib/libcrc32c.ko",
	"fs/mbcache.ko",
	"fs/jbd2/jbd2.ko",
	"fs/ext4/ext4.ko",
	"drivers/input/evdev.ko",
	"drivers/acpi/button.ko",
}

// BuildInitramfs writes a gzip'd newc initramfs holding init (the
// drover-init binary, as /init) and the Modules found under moduleDir
// (lib/modules/<version> of the kernel's package; "" for a kernel with
// the drivers built in). It returns the modules it included.
func BuildInitramfs(w io.Writer, init []byte, moduleDir string) ([]string, error) {
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	c := &cpioWriter{w: zw, ino: 1}
	for _, d := range []string{"dev", "proc", "sys", "newroot", "lib", "lib/modules", strings.TrimPrefix(ModulesDirPath, "/")} {
		c.entry(d, modeDir|0o755, nil, 0, 0)
	}
	c.entry("dev/console", modeCharDev|0o600, nil, 5, 1)
	c.entry("init", modeFile|0o755, init, 0, 0)
	var got []string
	if moduleDir != "" {
		for _, rel := range Modules {
			b, err := os.ReadFile(filepath.Join(moduleDir, "kernel", rel))
			if os.IsNotExist(err) {
				continue
			}
			if err != nil {
				return nil, err
			}
			name := filepath.Base(rel)
			c.entry(strings.TrimPrefix(ModulesDirPath, "/")+"/"+name, modeFile|0o644, b, 0, 0)
			got = append(got, name)
		}
		if len(got) == 0 {
			return nil, fmt.Errorf("no modules of %d found under %s/kernel (is it lib/modules/<version>?)", len(Modules), moduleDir)
		}
	}
	c.entry(strings.TrimPrefix(ModulesDirPath, "/")+"/order", modeFile|0o644, []byte(strings.Join(got, "\n")+"\n"), 0, 0)
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	if c.err != nil {
		return nil, c.err
	}
	return got, zw.Close()
}

// ModulesDirPath is where the initramfs holds its modules (the init's
// ModulesDir).
const ModulesDirPath = "/lib/modules/drover"

// cpio newc (the format the kernel unpacks as an initramfs).
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeCharDev = 0o020000
)

type cpioWriter struct {
	w   io.Writer
	ino uint32
	off int64
	err error
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte, rmajor, rminor uint32) {
	nlink, ino := uint32(1), c.ino
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	c.ino++
	if name == "TRAILER!!!" {
		ino = 0
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	c.write([]byte(hdr + name + "\x00"))
	c.pad()
	c.write(data)
	c.pad()
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil || len(b) == 0 {
		return
	}
	n, err := c.w.Write(b)
	c.off += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.off % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// InitramfsBytes is BuildInitramfs into memory.
func InitramfsBytes(init []byte, moduleDir string) ([]byte, error) {
	var b bytes.Buffer
	_, err := BuildInitramfs(&b, init, moduleDir)
	return b.Bytes(), err
}
