package qemutest

import (
	"fmt"
	"io"
	"strings"
)

// cpio mode bits (the file type part of st_mode).
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeCharDev = 0o020000
)

// cpioWriter writes a cpio archive in the "newc" format the Linux kernel
// unpacks as an initramfs: a 110-byte ASCII header of hex fields, the
// NUL-terminated name, the data, each padded to 4 bytes.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	off int64
	err error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w, ino: 1} }

// Dir adds a directory.
func (c *cpioWriter) Dir(name string, perm uint32) { c.entry(name, modeDir|perm, nil, 0, 0) }

// File adds a regular file.
func (c *cpioWriter) File(name string, perm uint32, data []byte) {
	c.entry(name, modeFile|perm, data, 0, 0)
}

// Symlink adds a symbolic link name → target.
func (c *cpioWriter) Symlink(name, target string) {
	c.entry(name, modeSymlink|0o777, []byte(target), 0, 0)
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm, major, minor uint32) {
	c.entry(name, modeCharDev|perm, nil, major, minor)
}

// Close writes the trailer; the caller closes the underlying writer.
func (c *cpioWriter) Close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	return c.err
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte, rmajor, rminor uint32) {
	if c.err != nil {
		return
	}
	name = strings.TrimPrefix(name, "/")
	nlink := uint32(1)
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	ino := c.ino
	c.ino++
	if name == "TRAILER!!!" {
		ino, nlink = 0, 1
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
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
